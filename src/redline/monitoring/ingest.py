"""Prometheus metrics for an ingest process: events, dead letters, freshness, consumer lag
(Kinesis: how far each shard's reader is behind the stream's tip).

Ingest runs in its own processes (``redline ingest ...``). :class:`MeteredSource` wraps any
ingest source (the ``Source`` protocol of ``features/ingest/loop.py``) and, at most once a
second, copies its ``stats()`` into Prometheus metrics. With ``PROMETHEUS_MULTIPROC_DIR`` shared
with the server they appear in the server's ``GET /metrics``; otherwise
:func:`serve_metrics` gives the process its own scrape port.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from redline.monitoring.prometheus import multiprocess_dir

if TYPE_CHECKING:
    from redline.features.ingest.loop import Source

log = logging.getLogger(__name__)


class IngestMetrics:
    """``redline_ingest_*`` metrics of one source, brought up to its latest ``stats()``."""

    def __init__(self, source: str, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.source = source
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.events = Counter("redline_ingest_events", "Events applied to the online store.",
                              ["source"], registry=reg)
        self.dead = Counter("redline_ingest_dead_letters", "Events refused (dead letters), by "
                            "reason class.", ["source", "reason"], registry=reg)
        self.freshness = Gauge("redline_ingest_freshness_seconds", "Event time to visible in the "
                               "store, over recent events.", ["source", "quantile"], registry=reg,
                               multiprocess_mode="livemax")
        self.lag = Gauge("redline_ingest_consumer_lag", "Entries (Redis Streams group lag) or "
                         "messages (Kafka: high watermark - position) not yet consumed.",
                         ["source", "stream_or_topic", "partition"], registry=reg,
                         multiprocess_mode="livemax")
        self.behind = Gauge("redline_ingest_behind_latest_seconds", "How far the last record "
                            "read from a shard is behind the tip of the stream (Kinesis "
                            "MillisBehindLatest).", ["source", "stream_or_topic", "partition"],
                            registry=reg, multiprocess_mode="livemax")
        self._last: dict[str, float] = {}

    def update(self, stats: dict[str, Any]) -> None:
        self._count(self.events.labels(self.source), "accepted", stats.get("accepted", 0))
        by_reason = stats.get("dead_by_reason") or {}
        if by_reason:
            for reason, n in by_reason.items():
                self._count(self.dead.labels(self.source, str(reason)), f"dead:{reason}", n)
        else:
            self._count(self.dead.labels(self.source, "any"), "dead", stats.get("dead", 0))
        fresh = stats.get("freshness") or {}
        for key, q in (("p50_ms", "0.5"), ("p99_ms", "0.99")):
            if fresh.get(key) is not None:
                self.freshness.labels(self.source, q).set(float(fresh[key]) / 1000.0)

    def update_lag(self, kind: str, lags: list[tuple[str, str, int]]) -> None:
        """Set the consumer-lag gauge from a source's ``consumer_lag()``."""
        for name, partition, lag in lags:
            self.lag.labels(kind, name, partition).set(float(lag))

    def update_behind(self, kind: str, behind: list[tuple[str, str, int]]) -> None:
        """Set the behind-latest gauge from a source's ``behind_latest()`` (milliseconds)."""
        for name, shard, ms in behind:
            self.behind.labels(kind, name, shard).set(ms / 1000.0)

    def _count(self, child: Any, key: str, total: float) -> None:
        last = self._last.get(key, 0.0)
        if total > last:
            child.inc(total - last)
        self._last[key] = float(total)


Lags = list[tuple[str, str, int]]  # [(stream or topic, partition or shard, how far behind)]


class IngestSource(Protocol):
    """An ingest source as its metrics read it: the ingest loop's ``Source``
    (``features/ingest/loop.py``), what names it, and its two measures of being behind (a
    source with no such measure returns none). ``features.ingest``'s ``StreamConsumer``,
    ``KafkaSource`` and ``KinesisSource`` satisfy it (monitoring imports none of them)."""

    @property
    def source_kind(self) -> str:
        """The metrics' ``source`` label: redis-stream, kafka, kinesis."""
        ...

    @property
    def source_name(self) -> str:
        """The stream or topic read."""
        ...

    def poll(self) -> int: ...

    def flush(self) -> int: ...

    def reset(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    def consumer_lag(self) -> Lags:
        """Entries or messages not yet consumed, per partition."""
        ...

    def behind_latest(self) -> Lags:
        """Milliseconds the last record read is behind the stream's tip, per shard."""
        ...


class MeteredSource:
    """An ingest source whose stats become metrics, at most once per ``every_s``."""

    def __init__(self, source: IngestSource, metrics: IngestMetrics,
                 every_s: float = 1.0) -> None:
        self.inner = source
        self.metrics = metrics
        self.every_s = every_s
        self.kind = source.source_kind
        self._next = 0.0

    def poll(self) -> int:
        n: int = self.inner.poll()
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every_s
            self.sample()
        return n

    def flush(self) -> int:
        n: int = self.inner.flush()
        self.sample()
        return n

    def sample(self) -> None:
        """Stats and consumer lag into the metrics (a lag query that fails skips one sample)."""
        self.metrics.update(self.inner.stats())
        try:
            self.metrics.update_lag(self.kind, self.inner.consumer_lag())
        except Exception as exc:  # noqa: BLE001 - metrics never stop ingest
            log.debug("consumer lag not sampled: %s", exc)
        self.metrics.update_behind(self.kind, self.inner.behind_latest())

    def reset(self) -> None:
        self.inner.reset()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.inner.stats()
        return stats

    def close(self) -> None:
        self.inner.close()


def serve_metrics(metrics: IngestMetrics, port: int, host: str = "127.0.0.1") -> None:
    """A scrape endpoint for this ingest process (when no multiprocess directory is shared)."""
    from prometheus_client import start_http_server

    if multiprocess_dir() is None:
        start_http_server(port, addr=host, registry=metrics.registry)


def metered(source: IngestSource) -> Source:
    """``source`` metered when ``PROMETHEUS_MULTIPROC_DIR`` is set (its metrics then join the
    server's scrape), else unchanged."""
    if multiprocess_dir() is None:
        return source
    return MeteredSource(source, IngestMetrics(source.source_name))
