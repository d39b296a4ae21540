"""Pinning models to the view versions they were trained on, and the on-disk registry of views.

The registry is a folder a user can read by listing it::

    <registry>/<view>/<version>.json     # the view's semantics when it was applied
    <registry>/<view>/live               # the version serving now (one line)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.errors import ConfigError, NotFound, VersionMismatch
from redline.features.definitions import FeatureDefinitions, FeatureView


def check_model_views(
    model: str, trained_on: Mapping[str, str], serving: Mapping[str, str]
) -> None:
    """Refuse to pair a model with view versions other than those it was trained on."""
    problems = []
    for view, version in sorted(trained_on.items()):
        live = serving.get(view)
        if live is None:
            problems.append(f"view '{view}' (trained on {version}) is not served")
        elif live != version:
            problems.append(f"view '{view}' is served at version {live}, the model was trained "
                            f"on {version}")
    if problems:
        raise VersionMismatch(
            f"model '{model}' cannot be served with these features: " + "; ".join(problems)
            + ". Switch the views back (`redline features apply --switch`) or retrain the model "
            "on the current versions.", model=model, problems=problems,
        )


@dataclass
class PlanEntry:
    view: str
    action: str  # create | new-version | unchanged | switch
    live: str | None
    version: str
    changes: list[str]


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class ViewRegistry:
    """Which versions of each view were applied, and which one is live."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def live(self) -> dict[str, str]:
        out = {}
        if self.root.exists():
            for d in sorted(self.root.iterdir()):
                f = d / "live"
                if f.exists():
                    out[d.name] = f.read_text().strip()
        return out

    def semantics(self, view: str, version: str) -> dict[str, Any]:
        path = self.root / view / f"{version}.json"
        if not path.exists():
            raise NotFound(f"view '{view}' has no applied version {version}")
        return dict(json.loads(path.read_text())["semantics"])

    def versions(self, view: str) -> list[str]:
        d = self.root / view
        if not d.exists():
            return []
        files = sorted(d.glob("*.json"), key=lambda p: json.loads(p.read_text())["applied_at"])
        return [p.stem for p in files]

    def plan(self, defs: FeatureDefinitions) -> list[PlanEntry]:
        live = self.live()
        out = []
        for name, view in sorted(defs.views.items()):
            cur = live.get(name)
            if cur is None:
                out.append(PlanEntry(name, "create", None, view.version, []))
            elif cur == view.version:
                out.append(PlanEntry(name, "unchanged", cur, view.version, []))
            else:
                known = view.version in self.versions(name)
                changes = _diff(self.semantics(name, cur), view.semantics())
                out.append(PlanEntry(name, "switch" if known else "new-version", cur,
                                     view.version, changes))
        return out

    def apply(self, defs: FeatureDefinitions, switch: bool = False) -> list[PlanEntry]:
        """Register every view version; make it live if new, or if ``switch``."""
        entries = self.plan(defs)
        for e in entries:
            view = defs.views[e.view]
            path = self.root / e.view / f"{view.version}.json"
            if not path.exists():
                _atomic_write(path, json.dumps({"semantics": view.semantics(),
                                                "applied_at": time.time()}, indent=1))
            if e.action == "create" or (switch and e.action in ("new-version", "switch")):
                _atomic_write(self.root / e.view / "live", view.version + "\n")
        return entries


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    changes = []
    of = {f[0]: f for f in old.get("features", [])}
    nf = {f[0]: f for f in new.get("features", [])}
    for name in sorted(set(nf) - set(of)):
        changes.append(f"+ feature {name}")
    for name in sorted(set(of) - set(nf)):
        changes.append(f"- feature {name}")
    for name in sorted(set(of) & set(nf)):
        if of[name] != nf[name]:
            changes.append(f"~ feature {name}: {of[name][1:]} -> {nf[name][1:]}")
    for key in ("entity", "source"):
        if old.get(key) != new.get(key):
            changes.append(f"~ {key}: {old.get(key)} -> {new.get(key)}")
    return changes


def view_from_semantics(semantics: Mapping[str, Any]) -> FeatureView:
    """Rebuild an applied view version from the registry's record of its semantics (what serving
    needs to read the version the registry calls live when ``features.py`` was edited since)."""
    from redline.features.definitions import Aggregation, Entity, EventSource

    ent_name, join_key = semantics["entity"]
    src = semantics["source"]
    source = EventSource(src["name"], Entity(ent_name, join_key), dict(src["fields"]),
                         timestamp=src["timestamp"], allowed_lateness=int(src["lateness_ms"]),
                         max_clock_skew=int(src["skew_ms"]), event_id=src.get("event_id"),
                         dedup_window=int(src.get("dedup_ms", 0)))
    aggs = [Aggregation(kind, fld, int(window), name=name, tile=int(tile), default=float(default))
            for name, kind, fld, window, tile, default in semantics["features"]]
    return FeatureView(semantics["view"], source, aggs)


def live_definitions(defs: FeatureDefinitions, registry: ViewRegistry) -> FeatureDefinitions:
    """The definitions serving reads: each view at the version the registry calls live.

    ``features apply`` decides what is live; an edit of ``features.py`` without ``apply`` changes
    nothing served (the live version is rebuilt from its recorded semantics). A view the registry
    has never seen is not served. Without a registry (nothing ever applied) the file itself is
    live: the embedded default needs no ``apply``.
    """
    live = registry.live()
    if not live:
        return defs
    objects: list[Any] = []
    for name, view in sorted(defs.views.items()):
        version = live.get(name)
        if version is None:
            continue
        if version != view.version:
            view = view_from_semantics(registry.semantics(name, version))
            if view.version != version:
                raise ConfigError(
                    f"feature registry {registry.root}: view '{name}' version {version} does not "
                    f"rebuild to itself (got {view.version}); re-apply it with "
                    "`redline features apply`")
        objects.append(view)
    served = {v.name for v in objects}
    objects += [t for t in defs.transforms.values()
                if all(ref.partition(":")[0] in served for ref in t.features)]
    objects += list(defs.entities.values())
    return FeatureDefinitions.of(objects, origin=defs.origin)


def nan_default_problems(model: str, feature_names: Sequence[str], missing_values: str,
                         defs: FeatureDefinitions) -> list[str]:
    """Features (and transforms) of a model that answer NaN when an entity has no data (or the
    store is down) while the model rejects NaN inputs: degradation would become a 400."""
    if missing_values == "allow":
        return []
    out = []
    for name in feature_names:
        if name in defs.transforms:
            t = defs.transforms[name]
            if math.isnan(t.default):
                out.append(f"transform '{name}' (default NaN)")
            continue
        if ":" not in name or name.partition(":")[0] not in defs.views:
            continue
        view, idx = defs.resolve(name)
        default = view.layout().outputs[idx].default
        if math.isnan(default):
            kind = view.layout().outputs[idx].kind
            out.append(f"'{name}' ({kind}, default NaN)")
    return out


def check_missing_policy(model: str, feature_names: Sequence[str], missing_values: str,
                         defs: FeatureDefinitions) -> None:
    """Refuse a model whose features default to NaN while it rejects NaN, naming the fix."""
    problems = nan_default_problems(model, feature_names, missing_values, defs)
    if problems:
        raise ConfigError(
            f"model '{model}' rejects NaN inputs (missing_values: reject) but "
            + ", ".join(problems) + " answer NaN for an entity with no events or while the "
            "store is down, which would turn degradation into 400s. Give those features a finite "
            "default (e.g. mean(..., default=0.0)) or register the model with "
            "--missing-values allow.")


def check_model_features(model: str, feature_names: Sequence[str],
                         trained_on: Mapping[str, str], missing_values: str,
                         defs: FeatureDefinitions) -> None:
    """What serving checks when a model version loads: its pinned view versions are the live
    ones, and no feature it reads answers NaN into a model that rejects NaN."""
    check_model_views(model, trained_on, defs.versions())
    check_missing_policy(model, feature_names, missing_values, defs)
