"""Pinning models to the view versions they were trained on, and the on-disk registry of views.

The registry is a folder a user can read by listing it::

    <registry>/<view>/<version>.json     # the view's semantics when it was applied
    <registry>/<view>/live               # the version serving now (one line)
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.errors import NotFound, VersionMismatch
from redline.features.definitions import FeatureDefinitions


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
