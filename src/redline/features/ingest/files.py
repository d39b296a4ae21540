"""File replay source: JSONL/CSV/Parquet backfill, read exactly as ``training-set`` reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from redline.features.ingest.core import Ingestor, IngestResult
from redline.features.online.base import now_ms
from redline.features.online.memory import MemoryStore
from redline.features.updates import Rejected


def replay_file(ingestor: Ingestor, path: str | Path, *, batch: int = 5000,
                arrival_column: str = "_arrival_ms", bulk: bool = True) -> IngestResult:
    """Backfill from JSONL/CSV/Parquet, read exactly as ``training-set`` reads it (the same
    ``eventfile.read_events``); arrival = ``arrival_column`` or the event time itself.
    A store with a ``bulk_loader`` (the memory store) gets its tiles in bulk, columnar: the
    same state; ``bulk=False`` writes each batch op by op, the reference it is held to."""
    from redline.features.eventfile import arrival_of, read_events

    log = read_events(path)
    raws: list[Any] = []
    arrivals = []
    for raw in log.raws:
        obj = raw
        if isinstance(raw, bytes):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
        # The event parsed once: the decoder takes the object itself (its bytes only when it
        # is not a plain event object, so that its dead letter reads as the file's line).
        is_event = type(obj) is dict and not (len(obj) == 1 and "d" in obj)
        raws.append(obj if is_event and isinstance(raw, bytes) else raw)
        ms = arrival_of(obj, ingestor.decoder, arrival_column)
        arrivals.append(ms or now_ms())
    accepted = 0
    rejected: list[Rejected] = []
    # the memory store folds a file's tiles at the end (``online/bulk.py``); Redis takes batches
    store = ingestor.store
    loader = store.bulk_loader() if bulk and isinstance(store, MemoryStore) else None
    for i in range(0, len(raws), batch):
        chunk = raws[i:i + batch]
        sink = loader.sink() if loader is not None else None
        decoded = ingestor.decoder.decode(chunk, arrivals[i:i + batch], flat=log.flat,
                                           str_keys=True, sink=sink)
        if loader is not None and sink is not None:
            loader.add(sink)  # the batch's tiles, folded at the end
        ingestor.apply(decoded, measure=False)
        accepted += len(decoded.accepted)
        for r in decoded.rejected:
            line = log.raws[r.tag + i]  # the file's own bytes, not the parsed object's
            rejected.append(Rejected(r.reason, line if isinstance(line, bytes) else r.raw,
                                     r.tag + i))
    if loader is not None:
        loader.flush()
    return IngestResult(accepted, rejected)
