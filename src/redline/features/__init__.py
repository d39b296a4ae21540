"""Real-time features: definitions, tiled windows, online stores, ingest, offline training sets.

Public face (what serving and the CLI import)::

    defs = load_definitions("features.py")           # entities, sources, views, transforms
    defs.versions()                                   # view -> semantic version
    store = open_online_store(settings.features)      # memory | redis
    reader = store.reader([defs.view("card")], ["card:amount_sum_1h", ...])
    values, missing = reader.read(["c1", "c2"], now_ms)   # float32 (n, f), bool (n,)
    Ingestor(defs, store).ingest(events)              # apply events in-process
"""

from __future__ import annotations

from redline.features.definitions import (
    Aggregation,
    Entity,
    EventSource,
    FeatureDefinitions,
    FeatureView,
    RequestTransform,
    agg_max,
    agg_min,
    agg_sum,
    count,
    distinct,
    last,
    load_definitions,
    mean,
    request_transform,
    stddev,
)
from redline.features.events import EventDecoder
from redline.features.ingest import Ingestor
from redline.features.online import FeatureReader, MemoryStore, OnlineStore, open_online_store
from redline.features.updates import UpdateBatch, entity_key
from redline.features.versioning import check_model_views

__all__ = [
    "Aggregation", "Entity", "EventDecoder", "EventSource", "FeatureDefinitions", "FeatureReader",
    "FeatureView", "Ingestor", "MemoryStore", "OnlineStore", "RequestTransform", "UpdateBatch",
    "agg_max", "agg_min", "agg_sum", "check_model_views", "count", "distinct", "entity_key",
    "last", "load_definitions", "mean", "open_online_store", "request_transform", "stddev",
]
