"""What a source is, and the one loop that runs any source (the CLI and the library both use it).

A source reads a batch from its log, decodes it with the shared decoder and hands it to the store
together with its log positions, so that the tiles and the positions change in one atomic step
(exactly-once effect). Adding another log (Pulsar, NATS JetStream) is one module with the
five methods of :class:`Source`; see docs/features-reference.md, "Adding a source".
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from redline.errors import StoreUnavailable
from redline.features.ingest.core import settle_heap


class Source(Protocol):
    """A log feeding the ingest core."""

    def poll(self) -> int:
        """Read, decode and apply one batch (one write may stay in flight); returns the events
        applied or dead-lettered. A store outage raises ``StoreUnavailable``."""
        ...

    def flush(self) -> int:
        """Wait for the write in flight; returns its events."""
        ...

    def reset(self) -> None:
        """After an outage: forget in-flight state and resume from the positions in the store."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_source(source: Source, *, stop: Callable[[], bool] = lambda: False,
               max_events: int | None = None, stats_every: float = 0.0,
               log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Poll ``source`` until ``stop()`` or ``max_events``; a store outage is waited out with
    backoff (nothing is lost: positions only advance with the tiles). Returns the final stats."""
    settle_heap()  # the loop is the process's life: keep full collections off the startup heap
    seen = 0
    backoff = 0.1
    next_stats = time.monotonic() + stats_every
    try:
        while not stop():
            try:
                seen += source.poll()
                backoff = 0.1
            except StoreUnavailable as exc:
                log(f"ingest: {exc.message}; retrying in {backoff:.1f}s")
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                try:
                    source.reset()
                except Exception:  # noqa: BLE001 - still down: try again next round
                    pass
                continue
            if stats_every and time.monotonic() >= next_stats:
                next_stats = time.monotonic() + stats_every
                log(json.dumps(source.stats()))
            if max_events is not None and seen >= max_events:
                break
    finally:
        try:
            source.flush()
        except StoreUnavailable as exc:
            log(f"ingest: {exc.message}; the last batch stays unacknowledged and is re-read")
    return source.stats()
