"""What every online store offers: compiled readers and batch writes of tile updates."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from redline.errors import FeatureNotFound, InvalidInput
from redline.features.definitions import FeatureView
from redline.features.updates import KEY_PREFIX, Rejected, UpdateBatch

EntityIds = Sequence[str] | Mapping[str, Sequence[str]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReadPlan:
    """Views to read, and where each caller-ordered feature sits in the views' outputs."""

    def __init__(self, views: Sequence[FeatureView], features: Sequence[str] | None) -> None:
        if not views:
            raise InvalidInput("a feature reader needs at least one view")
        self.views = list(views)
        offsets: dict[str, int] = {}
        base = 0
        defaults: list[float] = []
        for v in self.views:
            for i, o in enumerate(v.layout().outputs):
                offsets[f"{v.name}:{o.name}"] = base + i
                defaults.append(o.default)
            base += len(v.layout().outputs)
        self.width = base
        if features is None:
            features = list(offsets)
        missing = [f for f in features if f not in offsets]
        if missing:
            raise FeatureNotFound(
                f"unknown feature(s) {missing}: the reader's views offer {sorted(offsets)}"
            )
        self.features = list(features)
        self.take = np.array([offsets[f] for f in features], dtype=np.intp)
        self.defaults = np.array(defaults, dtype=np.float64)
        self.entities = [v.entity.name for v in self.views]

    def ids_per_view(self, ids: EntityIds) -> tuple[int, list[Sequence[str]]]:
        """Entity ids for each view (a plain list serves views of one entity type)."""
        if isinstance(ids, Mapping):
            cols: list[Sequence[str]] = []
            for ent in self.entities:
                if ent not in ids:
                    raise InvalidInput(f"missing ids for entity '{ent}' (got {sorted(ids)})")
                cols.append([str(x) for x in ids[ent]])
            n = len(cols[0])
            if any(len(c) != n for c in cols):
                raise InvalidInput("every entity id list must have the same length")
            return n, cols
        lst = [str(x) for x in ids]
        if len(set(self.entities)) > 1:
            raise InvalidInput(f"views span entities {sorted(set(self.entities))}; pass a mapping "
                               "entity -> ids")
        return len(lst), [lst] * len(self.views)

    def keys(self, ids: EntityIds) -> tuple[int, list[str]]:
        """Keys row-major: entity 0's views, entity 1's views..."""
        n, cols = self.ids_per_view(ids)
        out = []
        for r in range(n):
            for j, v in enumerate(self.views):
                out.append(f"{KEY_PREFIX}:{{{v.entity.name}:{cols[j][r]}}}:{v.name}:{v.version}")
        return n, out


class FeatureReader(Protocol):
    plan: ReadPlan

    def read(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
             ) -> tuple[np.ndarray, np.ndarray]:
        """(matrix n×features in the caller's order, bool mask of entities with no data).

        ``now`` defaults to the wall clock (epoch ms); ``dtype`` float64 gives exact values."""
        ...

    def read_timed(self, ids: EntityIds, now: int | None = None, dtype: type = np.float32
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`read` and, per row and view, the newest event time (epoch ms, NaN: none) of
        the tiles the read merged: the feature age at read is ``now`` minus it."""
        ...


class OnlineStore(Protocol):
    kind: str

    def reader(self, views: Sequence[FeatureView],
               features: Sequence[str] | None = None) -> FeatureReader: ...

    def write(self, batch: UpdateBatch) -> None: ...

    def register(self, views: Sequence[FeatureView]) -> None:
        """Views whose keys this store may see (the memory store lays out their tiles from
        them; Redis needs nothing)."""
        ...

    def add_dead_letters(self, stream: str, rejected: Sequence[Rejected]) -> None:
        """Keep refused events where every process can see them (Redis: appended to
        ``stream``; the memory store keeps none beyond the ingestor's own)."""
        ...

    def ping(self) -> None: ...

    def close(self) -> None: ...
