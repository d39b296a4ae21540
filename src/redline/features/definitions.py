"""The declarative feature API: entities, event sources, feature views, request transforms.

A definitions file is ordinary Python referenced from ``redline.yaml`` (``features.definitions``);
:func:`load_definitions` collects the objects it declares. Every view has a version derived from
its semantics (:attr:`FeatureView.version`): change a window, a field or a default and the version
— and with it the online keyspace — changes; edit a description and it does not.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import ConfigError, FeatureNotFound
from redline.features.layout import ViewLayout
from redline.features.tiles import (
    TileWindow,
    default_tile_ms,
    format_duration,
    parse_duration,
)

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
AGGREGATIONS = ("count", "sum", "mean", "min", "max", "last", "stddev", "distinct")
NUMERIC_TYPES = {"int": int, "float": float}
FIELD_TYPES = {"int", "float", "str", "bool"}
_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}


@dataclass(frozen=True)
class Entity:
    """What features describe (a card, a user); ``join_key`` is the field holding its id."""

    name: str
    join_key: str


@dataclass(frozen=True)
class EventSource:
    """A stream of events of one shape. ``timestamp`` names the event-time field (epoch ms, or an
    ISO-8601 string); ``schema`` maps field → ``int|float|str|bool`` (types or their names)."""

    name: str
    entity: Entity
    schema: dict[str, Any]
    timestamp: str = "ts"
    allowed_lateness: str | int = "5m"
    max_clock_skew: str | int = "1s"
    # a field holding a unique event id: a redelivered event (same id, same entity) within
    # ``dedup_window`` of arrival time is applied once; None: no deduplication
    event_id: str | None = None
    dedup_window: str | int = "10m"

    @property
    def lateness_ms(self) -> int:
        return parse_duration(self.allowed_lateness)

    @property
    def dedup_ms(self) -> int:
        """Arrival-time span of remembered event ids per entity (0: no deduplication)."""
        return parse_duration(self.dedup_window) if self.event_id else 0

    @property
    def skew_ms(self) -> int:
        return parse_duration(self.max_clock_skew)

    def field_types(self) -> dict[str, str]:
        """Schema with type names normalised (``float`` → ``"float"``)."""
        out = {}
        for name, typ in self.schema.items():
            tname = _TYPE_NAMES.get(typ, typ)
            if tname not in FIELD_TYPES:
                raise ConfigError(
                    f"source '{self.name}': field '{name}' has type {typ!r}; use int, float, str "
                    "or bool"
                )
            out[name] = tname
        return out


@dataclass(frozen=True)
class Aggregation:
    """One windowed aggregate: ``kind`` of ``field`` over ``window`` (``count`` needs no field)."""

    kind: str
    field: str | None
    window: str | int
    name: str | None = None
    tile: str | int | None = None
    default: float = math.nan  # value when the window holds no events (count/sum/distinct: 0)

    @property
    def window_ms(self) -> int:
        return parse_duration(self.window)

    @property
    def tile_ms(self) -> int:
        if self.tile is None:
            return default_tile_ms(self.window_ms)
        return parse_duration(self.tile)

    @property
    def feature_name(self) -> str:
        if self.name:
            return self.name
        w = format_duration(self.window_ms)
        return f"count_{w}" if self.kind == "count" else f"{self.field}_{self.kind}_{w}"

    @property
    def default_value(self) -> float:
        return 0.0 if self.kind in ("count", "sum", "distinct") else float(self.default)


def count(window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("count", None, window, **kw)


def agg_sum(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("sum", field_name, window, **kw)


def mean(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("mean", field_name, window, **kw)


def agg_min(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("min", field_name, window, **kw)


def agg_max(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("max", field_name, window, **kw)


def last(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("last", field_name, window, **kw)


def stddev(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("stddev", field_name, window, **kw)


def distinct(field_name: str, window: str | int, **kw: Any) -> Aggregation:
    return Aggregation("distinct", field_name, window, **kw)


@dataclass
class FeatureView:
    """Aggregations of one source's events per entity, over sliding windows."""

    name: str
    source: EventSource
    features: Sequence[Aggregation]
    description: str = ""
    _layout: Any = field(default=None, init=False, repr=False, compare=False)
    _version: str = field(default="", init=False, repr=False, compare=False)

    @property
    def entity(self) -> Entity:
        return self.source.entity

    def semantics(self) -> dict[str, Any]:
        """Everything that changes values — and so the version — and nothing else."""
        types = self.source.field_types()
        return {
            "view": self.name,
            "entity": [self.entity.name, self.entity.join_key],
            "source": {
                "name": self.source.name,
                "timestamp": self.source.timestamp,
                "lateness_ms": self.source.lateness_ms,
                "skew_ms": self.source.skew_ms,
                **({"event_id": self.source.event_id, "dedup_ms": self.source.dedup_ms}
                   if self.source.event_id else {}),
                # every schema field: admission checks them all, so they change values
                "fields": types,
            },
            "features": [
                [a.feature_name, a.kind, a.field, a.window_ms, a.tile_ms, repr(a.default_value)]
                for a in self.features
            ],
        }

    @property
    def version(self) -> str:
        """12 hex digits of the sha256 of :meth:`semantics`: equal semantics, equal version."""
        if not self._version:  # hashed once: keys are built from it on every read
            blob = json.dumps(self.semantics(), sort_keys=True, separators=(",", ":"))
            self._version = hashlib.sha256(blob.encode()).hexdigest()[:12]
        return self._version

    @property
    def feature_names(self) -> list[str]:
        return [a.feature_name for a in self.features]

    def ref(self, feature: str) -> str:
        return f"{self.name}:{feature}"

    def layout(self) -> ViewLayout:
        if self._layout is None:
            self.validate()
            self._layout = ViewLayout.build(self.name, self.features, self.source.skew_ms,
                                            self.source.lateness_ms)
        return self._layout

    def validate(self) -> None:
        for what, name in (("view", self.name), ("entity", self.entity.name),
                           ("source", self.source.name)):
            if not _NAME.match(name):
                raise ConfigError(f"{what} name {name!r} must be letters, digits, '_', '-' or '.' "
                                  "(it is part of every online key)")
        types = self.source.field_types()
        seen: set[str] = set()
        if not self.features:
            raise ConfigError(f"view '{self.name}' has no features")
        for a in self.features:
            where = f"view '{self.name}', feature '{a.feature_name}'"
            if a.kind not in AGGREGATIONS:
                raise ConfigError(
                    f"{where}: unknown aggregation '{a.kind}' (known: {', '.join(AGGREGATIONS)})")
            if a.feature_name in seen:
                raise ConfigError(f"{where}: duplicate feature name; give one a name=")
            seen.add(a.feature_name)
            if a.kind != "count":
                if a.field not in types:
                    raise ConfigError(
                        f"{where}: field '{a.field}' is not in source '{self.source.name}' schema "
                        f"({sorted(types)})"
                    )
                if a.kind != "distinct" and types[a.field] not in ("int", "float", "bool"):
                    raise ConfigError(f"{where}: '{a.kind}' needs a numeric field, "
                                      f"'{a.field}' is {types[a.field]}")
            try:
                TileWindow(a.window_ms, a.tile_ms)
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
            if a.window_ms // a.tile_ms > 10_000:
                raise ConfigError(f"{where}: {a.window_ms // a.tile_ms} tiles per window is too "
                                  "many (at most 10000; every read merges them): use a larger "
                                  "tile=")


@dataclass(frozen=True)
class RequestTransform:
    """A pure, vectorised function of request fields and fetched features.

    ``fn`` receives one numpy float64 array per input (request fields first, then features, in
    the declared order; one element per row) and returns an array of the same length. The same
    call runs online (a batch of requests) and offline (a training table), so the two agree.
    """

    name: str
    fn: Callable[..., Any]
    request: Sequence[str] = ()
    features: Sequence[str] = ()  # "view:feature" references
    default: float = math.nan

    def compute(self, columns: Sequence[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            out = np.asarray(self.fn(*columns), dtype=np.float64)
        expected = columns[0].shape if columns else out.shape
        if out.ndim == 0 and columns:
            out = np.full(expected, float(out))
        if out.shape != expected:
            raise ConfigError(f"transform '{self.name}' returned shape {out.shape}, "
                              f"expected {expected}")
        return np.where(np.isfinite(out), out, self.default)


def request_transform(
    *, request: Sequence[str] = (), features: Sequence[str] = (), name: str | None = None,
    default: float = math.nan,
) -> Callable[[Callable[..., Any]], RequestTransform]:
    """Decorator form of :class:`RequestTransform`."""

    def wrap(fn: Callable[..., Any]) -> RequestTransform:
        return RequestTransform(name or fn.__name__, fn, tuple(request), tuple(features), default)

    return wrap


@dataclass
class FeatureDefinitions:
    """Everything one definitions file declares, indexed by name."""

    entities: dict[str, Entity]
    sources: dict[str, EventSource]
    views: dict[str, FeatureView]
    transforms: dict[str, RequestTransform]
    origin: str = ""

    @staticmethod
    def of(objects: Sequence[Any], origin: str = "") -> FeatureDefinitions:
        defs = FeatureDefinitions({}, {}, {}, {}, origin)
        for obj in objects:
            if isinstance(obj, FeatureView):
                defs._add(defs.views, obj.name, obj, "view")
                defs._add(defs.sources, obj.source.name, obj.source, "source")
                defs._add(defs.entities, obj.entity.name, obj.entity, "entity")
            elif isinstance(obj, EventSource):
                defs._add(defs.sources, obj.name, obj, "source")
                defs._add(defs.entities, obj.entity.name, obj.entity, "entity")
            elif isinstance(obj, Entity):
                defs._add(defs.entities, obj.name, obj, "entity")
            elif isinstance(obj, RequestTransform):
                defs._add(defs.transforms, obj.name, obj, "transform")
        for view in defs.views.values():
            view.layout()
        for t in defs.transforms.values():
            for ref in t.features:
                defs.resolve(ref)
        return defs

    @staticmethod
    def _add(table: dict[str, Any], name: str, obj: Any, what: str) -> None:
        if name in table and table[name] != obj:
            raise ConfigError(f"two different {what}s are named '{name}'; names must be unique")
        table[name] = obj

    def view(self, name: str) -> FeatureView:
        try:
            return self.views[name]
        except KeyError:
            raise FeatureNotFound(
                f"unknown feature view '{name}' (defined: {', '.join(sorted(self.views))})"
            ) from None

    def resolve(self, ref: str) -> tuple[FeatureView, int]:
        """``"view:feature"`` → (view, index of the feature in the view's outputs)."""
        view_name, _, feature = ref.partition(":")
        view = self.view(view_name)
        names = view.feature_names
        if feature not in names:
            raise FeatureNotFound(
                f"view '{view_name}' has no feature '{feature}' (it has: {', '.join(names)})"
            )
        return view, names.index(feature)

    def versions(self) -> dict[str, str]:
        """view name → semantic version, what a model records at training time."""
        return {name: v.version for name, v in sorted(self.views.items())}

    def feature_info(self) -> list[dict[str, Any]]:
        """Every feature's reference, dtype and default (for model metadata and docs)."""
        rows = []
        for view in self.views.values():
            for a in view.features:
                rows.append({"ref": view.ref(a.feature_name), "kind": a.kind, "dtype": "float32",
                             "default": a.default_value, "window_ms": a.window_ms,
                             "tile_ms": a.tile_ms, "view_version": view.version})
        for t in self.transforms.values():
            rows.append({"ref": t.name, "kind": "transform", "dtype": "float32",
                         "default": t.default})
        return rows


def load_definitions(target: str | Path) -> FeatureDefinitions:
    """Load a definitions file (``defs.py``) or an importable module name (``pkg.features``)."""
    text = str(target)
    try:
        if text.endswith(".py") or Path(text).exists():
            path = Path(text)
            if not path.exists():
                raise ConfigError(f"feature definitions file {path} does not exist "
                                  "(set features.definitions in redline.yaml)")
            digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
            mod_name = f"_redline_features_{digest}"
            spec = importlib.util.spec_from_file_location(mod_name, path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(text)
    except ConfigError:
        raise
    except Exception as exc:  # a user's file may raise anything; say where it came from
        raise ConfigError(f"cannot load feature definitions from {text}: "
                          f"{type(exc).__name__}: {exc}") from exc
    return FeatureDefinitions.of(list(vars(module).values()), origin=text)
