"""The compiled shape of a feature view in an online store: its aggregations grouped onto tile
grids (one per field and tile size), the windows a read merges once, and the output each
feature takes from one of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redline.errors import ConfigError
from redline.features.tiles import TileWindow, ring_size


class AggregationShape(Protocol):
    """What a layout reads of an aggregation (``definitions.Aggregation``)."""

    @property
    def kind(self) -> str: ...
    @property
    def field(self) -> str | None: ...
    @property
    def window_ms(self) -> int: ...
    @property
    def tile_ms(self) -> int: ...
    @property
    def feature_name(self) -> str: ...
    @property
    def default_value(self) -> float: ...


@dataclass(frozen=True)
class TileGroup:
    """One tile grid of one field (``None``: events only): what an online store keeps per entity."""

    gid: int
    field: str | None
    hll: bool
    tile_ms: int
    tiles: int  # the longest window on this grid, in tiles
    ring: int  # slots kept (see tiles.ring_size)


@dataclass(frozen=True)
class WindowRef:
    """A (tile group, window length) pair that reads merge once and derive features from."""

    wid: int
    gid: int
    window: TileWindow


@dataclass(frozen=True)
class OutputSpec:
    """One feature's output: its aggregation, the window it reads and its value when empty."""

    name: str
    kind: str
    wid: int
    default: float



@dataclass(frozen=True)
class ViewLayout:
    """The compiled shape of a view: tile groups, the windows reads merge, and the outputs."""

    groups: tuple[TileGroup, ...]
    windows: tuple[WindowRef, ...]
    outputs: tuple[OutputSpec, ...]
    ttl_ms: int

    @staticmethod
    def build(name: str, features: Sequence[AggregationShape], skew_ms: int,
              lateness_ms: int) -> ViewLayout:
        """The layout of view ``name`` (checked already) whose source allows ``skew_ms`` of
        clock skew and ``lateness_ms`` of lateness."""
        skew = skew_ms
        # A count rides on a numeric group of the same tile size when there is one (its records
        # count events too): one less ring to store and to merge on every read.
        numeric = {a.tile_ms: a.field for a in sorted(features, key=lambda a: a.field or "")
                   if a.kind not in ("count", "distinct")}

        def group_key(a: AggregationShape) -> tuple[str | None, bool, int]:
            if a.kind == "count":
                return (numeric.get(a.tile_ms), False, a.tile_ms)
            return (a.field, a.kind == "distinct", a.tile_ms)

        grid: dict[tuple[str | None, bool, int], int] = {}
        for a in features:
            key = group_key(a)
            grid[key] = max(grid.get(key, 0), a.window_ms // a.tile_ms)
        groups = tuple(
            TileGroup(i, fld, hll, tile, k, ring_size(k, tile, skew))
            for i, ((fld, hll, tile), k) in enumerate(sorted(grid.items(), key=_group_order))
        )
        if len(groups) > 256:  # a group is one byte of its tag in the Redis hash
            raise ConfigError(f"view '{name}' needs {len(groups)} tile grids (at most 256): "
                              "use fewer distinct (field, tile size) pairs or split the view")
        by_key = {(g.field, g.hll, g.tile_ms): g.gid for g in groups}
        windows: dict[tuple[int, int], WindowRef] = {}
        outputs = []
        for a in features:
            gid = by_key[group_key(a)]
            wkey = (gid, a.window_ms)
            if wkey not in windows:
                windows[wkey] = WindowRef(len(windows), gid, TileWindow(a.window_ms, a.tile_ms))
            outputs.append(OutputSpec(a.feature_name, a.kind, windows[wkey].wid, a.default_value))
        ttl = max(g.ring * g.tile_ms for g in groups) + lateness_ms
        return ViewLayout(groups, tuple(windows.values()), tuple(outputs), ttl)


def _group_order(item: Any) -> tuple[str, bool, int]:
    (fld, hll, tile), _ = item
    return (fld or "", hll, tile)
