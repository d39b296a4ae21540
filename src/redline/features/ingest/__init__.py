"""Ingest: one core (decoded events → tile updates, applied atomically) fed by small sources.

* :mod:`.core` — :class:`Ingestor`: validate, apply, dead-letter, count, measure freshness.
* :mod:`.loop` — the :class:`Source` interface and :func:`run_source`, the one loop.
* :mod:`.redis_streams` — Redis Streams consumer groups (:class:`StreamConsumer`).
* :mod:`.kafka` — Kafka consumer groups (``redline[kafka]``; imported on use).
* :mod:`.kinesis` — every shard of a Kinesis stream (``redline[kinesis]``; imported on use).
* :mod:`.files` — JSONL/CSV/Parquet replay (:func:`replay_file`).
* :mod:`.http` — ``POST /v1/events`` (:func:`handle_events`, :func:`events_asgi_app`).
* :mod:`.push` — :class:`EventPush`: a push's write off the event loop, in arrival order.
"""

from __future__ import annotations

from redline.features.ingest.core import (
    Freshness,
    IngestCounts,
    Ingestor,
    IngestResult,
    reason_class,
)
from redline.features.ingest.files import replay_file
from redline.features.ingest.http import events_asgi_app, handle_events, parse_body
from redline.features.ingest.loop import Source, run_source
from redline.features.ingest.push import EventPush
from redline.features.ingest.redis_streams import StreamConsumer

__all__ = ["EventPush", "Freshness", "IngestCounts", "IngestResult", "Ingestor", "Source",
           "StreamConsumer", "events_asgi_app", "handle_events", "parse_body", "reason_class",
           "replay_file", "run_source"]
