"""``redline ingest ...``: run a source (Redis Streams, Kafka, Kinesis, a file, HTTP push) into
the online store, and events of source ``session`` into the servers' session store."""

from __future__ import annotations

import json
import signal
import time
from typing import TYPE_CHECKING, Any

import click

from redline.commands._common import config_option
from redline.commands._feature_options import (
    definitions_option,
    feature_settings,
    store_options,
)
from redline.config import load_settings
from redline.errors import InvalidInput

if TYPE_CHECKING:
    from redline.monitoring.ingest import IngestSource


def _session_writer(config_path: str | None, store: Any) -> Any:
    """Where ingest stores events of source ``session``: the servers' session store (in the
    same Redis, with the same TTL, length and catalogue), through the servers' own writer."""
    from redline.serving.predict import open_sessions
    from redline.serving.predict.session_events import SessionEventWriter, load_catalogue

    settings = load_settings(config_path)
    cfg = settings.pipeline
    catalogue = load_catalogue(cfg.session_catalogue) if cfg.session_catalogue else None
    return SessionEventWriter(open_sessions(store, settings), catalogue)



@click.group()
def ingest() -> None:
    """Ingest events into the online store (events of source "session" into the session store).

    Without feature definitions (a recommender with no feature views) only session events are
    taken; any other event is a dead letter saying why.

    \b
    Examples:
      redline ingest redis-stream                 # consumer group member (run N of these)
      redline ingest kafka --topic card-events    # Kafka consumer group member (run N)
      redline ingest kinesis --stream card-events # every shard of a Kinesis stream
      redline ingest file events.jsonl --store redis
      redline ingest http --http-port 8010        # POST /v1/events
    """


@ingest.command("redis-stream")
@config_option
@definitions_option
@click.option("--redis-url", default=None, help="Redis URL (default: features.redis_url).")
@click.option("--stream", default=None, help="Stream key (default: features.stream).")
@click.option("--group", default=None, help="Consumer group (default: features.consumer_group).")
@click.option("--consumer", default=None, help="Consumer name (default: host-pid).")
@click.option("--batch", type=int, default=None, help="Entries per atomic apply.")
@click.option("--claim-idle-ms", type=int, default=None,
              help="Claim pending entries idle this long from dead consumers (default: "
                   "features.claim_idle_ms).")
@click.option("--max-events", type=int, default=None, help="Stop after this many (for tests).")
@click.option("--stats-every", type=float, default=10.0, show_default=True,
              help="Seconds between stats lines on stderr (0: never).")
def ingest_stream(config_path: str | None, definitions: str | None, redis_url: str | None,
                  stream: str | None, group: str | None, consumer: str | None,
                  batch: int | None, claim_idle_ms: int | None, max_events: int | None,
                  stats_every: float) -> None:
    """Consume a Redis Stream as one member of a consumer group, exactly once per event.

    \b
    Examples:
      redline ingest redis-stream --config redline.yaml            # run N of these
      redline ingest redis-stream -d features.py --redis-url redis://127.0.0.1:6379/0 \\
          --stream events --group ingest
    """
    from redline.features.ingest import StreamConsumer
    from redline.features.online import open_online_store
    from redline.features.online.redis import RedisStore

    fs, defs = feature_settings(config_path, definitions, "redis", redis_url,
                                sessions_only=True)
    store = open_online_store(fs, timeout_ms=fs.ingest_timeout_ms)
    assert isinstance(store, RedisStore)  # features.store: redis, with its failover settings
    store.ping()
    cons = StreamConsumer(defs, store, stream=stream or fs.stream,
                          group=group or fs.consumer_group, consumer=consumer,
                          batch=batch or fs.ingest_batch,
                          claim_idle_ms=fs.claim_idle_ms if claim_idle_ms is None
                          else claim_idle_ms,
                          sessions=_session_writer(config_path, store))
    _run(cons, max_events, stats_every,
         f"ingest: consumer {cons.consumer} on {cons.stream} group {cons.group}")


def _run(source: IngestSource, max_events: int | None, stats_every: float,
         running: str) -> None:
    """The library's loop (``features.ingest.run_source``), stopped by SIGTERM or Ctrl-C.

    SIGTERM is taken over before the ``running`` line is printed: a stop sent once that line
    shows (an orchestrator's, a test's) always ends in a clean exit."""
    from redline.features.ingest import run_source
    from redline.monitoring.ingest import metered

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    looped = metered(source)  # ingest metrics, when the server's metrics directory is shared
    click.echo(running, err=True)
    try:
        stats = run_source(looped, stop=lambda: bool(stopping), max_events=max_events,
                           stats_every=stats_every, log=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        looped.flush()
        stats = looped.stats()
    looped.close()
    click.echo(json.dumps(stats))


@ingest.command("kafka")
@config_option
@definitions_option
@click.option("--redis-url", default=None, help="Redis URL (default: features.redis_url).")
@click.option("--bootstrap-servers", default=None,
              help="Kafka brokers, host:port[,...] (default: features.kafka_bootstrap_servers).")
@click.option("--topic", default=None, help="Topic (default: features.kafka_topic).")
@click.option("--group", default=None, help="Consumer group (default: features.kafka_group).")
@click.option("--kafka-option", "kafka_options", multiple=True, metavar="KEY=VALUE",
              help="A librdkafka setting (security.protocol=SASL_SSL, ...); repeatable; adds to "
                   "features.kafka_config.")
@click.option("--batch", type=int, default=None, help="Messages per atomic apply.")
@click.option("--max-events", type=int, default=None, help="Stop after this many (for tests).")
@click.option("--stats-every", type=float, default=10.0, show_default=True,
              help="Seconds between stats lines on stderr (0: never).")
def ingest_kafka(config_path: str | None, definitions: str | None, redis_url: str | None,
                 bootstrap_servers: str | None, topic: str | None, group: str | None,
                 kafka_options: tuple[str, ...], batch: int | None, max_events: int | None,
                 stats_every: float) -> None:
    """Consume a Kafka topic as one member of a consumer group, with exactly-once effect.

    Run several: partitions are shared and rebalance when one joins, leaves or dies. Messages
    should be keyed by entity id. Works with redis_cluster: true.

    \b
    Examples:
      redline ingest kafka --bootstrap-servers 127.0.0.1:9092 --topic card-events
      redline ingest kafka --kafka-option security.protocol=SASL_SSL \
        --kafka-option sasl.mechanism=PLAIN --kafka-option sasl.username=me
    """
    from redline.features.ingest.kafka import KafkaSource
    from redline.features.online import open_online_store
    from redline.features.online.redis import RedisStore

    fs, defs = feature_settings(config_path, definitions, "redis", redis_url,
                                sessions_only=True)
    config = dict(fs.kafka_config)
    for opt in kafka_options:
        key, sep, value = opt.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--kafka-option must be KEY=VALUE, got {opt!r}")
        config[key] = value
    store = open_online_store(fs, timeout_ms=fs.ingest_timeout_ms)
    assert isinstance(store, RedisStore)  # features.store: redis, with its failover settings
    store.ping()
    src = KafkaSource(defs, store, topic=topic or fs.kafka_topic,
                      bootstrap=bootstrap_servers or fs.kafka_bootstrap_servers,
                      group=group or fs.kafka_group, batch=batch or fs.ingest_batch,
                      config=config, sessions=_session_writer(config_path, store))
    _run(src, max_events, stats_every,
         f"ingest: {src.name} on kafka topic {src.topic} group {src.group}")


@ingest.command("kinesis")
@config_option
@definitions_option
@click.option("--redis-url", default=None, help="Redis URL (default: features.redis_url).")
@click.option("--stream", default=None, help="Stream name (default: features.kinesis_stream).")
@click.option("--region", default=None,
              help="AWS region (default: features.kinesis_region, else AWS_REGION).")
@click.option("--endpoint-url", default=None,
              help="A Kinesis-compatible endpoint (default: features.kinesis_endpoint_url, "
                   "else AWS's).")
@click.option("--batch", type=int, default=None, help="Records per GetRecords call.")
@click.option("--max-events", type=int, default=None, help="Stop after this many (for tests).")
@click.option("--stats-every", type=float, default=10.0, show_default=True,
              help="Seconds between progress lines on stderr (0: never).")
def ingest_kinesis(config_path: str | None, definitions: str | None, redis_url: str | None,
                   stream: str | None, region: str | None, endpoint_url: str | None,
                   batch: int | None, max_events: int | None, stats_every: float) -> None:
    """Read every shard of a Kinesis stream, with exactly-once effect.

    Each shard resumes after the last record applied (its checkpoint is kept in Redis with the
    tiles); after a reshard, parents are drained before their children. Records should be keyed
    (partition key) by entity id. Works with redis_cluster: true.

    \b
    Examples:
      redline ingest kinesis --stream card-events --region eu-west-1
      redline ingest kinesis --stream card-events --endpoint-url http://127.0.0.1:4567
    """
    from redline.features.ingest.kinesis import KinesisSource
    from redline.features.online import open_online_store
    from redline.features.online.redis import RedisStore

    fs, defs = feature_settings(config_path, definitions, "redis", redis_url,
                                sessions_only=True)
    store = open_online_store(fs, timeout_ms=fs.ingest_timeout_ms)
    assert isinstance(store, RedisStore)  # features.store: redis, with its failover settings
    store.ping()
    src = KinesisSource(defs, store, stream=stream or fs.kinesis_stream,
                        region=region or fs.kinesis_region,
                        endpoint_url=endpoint_url or fs.kinesis_endpoint_url,
                        batch=batch or fs.ingest_batch,
                        sessions=_session_writer(config_path, store))
    _run(src, max_events, stats_every,
         f"ingest: {src.name} on kinesis stream {src.stream} at {src.endpoint}")


@ingest.command("file")
@config_option
@definitions_option
@store_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--batch", type=int, default=5000, show_default=True,
              help="Events per atomic write.")
def ingest_file(config_path: str | None, definitions: str | None, store: str | None,
                redis_url: str | None, path: str, batch: int) -> None:
    """Replay a JSONL/CSV/Parquet file (arrival = `_arrival_ms` column, else event time).

    With the memory store this fills a store inside this command's process only; to give a
    server its history use `redline serve --preload FILE`, or POST to its /v1/events.

    \b
    Examples:
      redline ingest file data/events.jsonl --config redline.yaml        # into Redis
      redline ingest file events.parquet -d features.py --redis-url redis://127.0.0.1:6379/0
    """
    from redline.features.ingest import Ingestor, replay_file
    from redline.features.online import open_online_store

    fs, defs = feature_settings(config_path, definitions, store, redis_url,
                                sessions_only=True)
    online = open_online_store(fs, timeout_ms=fs.ingest_timeout_ms)
    ing = Ingestor(defs, online, dead_stream=f"{fs.stream}:dead",
                   sessions=_session_writer(config_path, online))
    t0 = time.perf_counter()
    res = replay_file(ing, path, batch=batch)
    dt = time.perf_counter() - t0
    click.echo(json.dumps({"accepted": res.accepted, "dead": len(res.rejected),
                           "dead_by_reason": ing.stats()["dead_by_reason"],
                           "seconds": round(dt, 3)}))
    for r in res.rejected[:10]:
        click.echo(f"  dead letter #{r.tag}: {r.reason}", err=True)


@ingest.command("http")
@config_option
@definitions_option
@store_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--http-port", "port", type=click.IntRange(0, 65535), default=None,
              help="Port (default: features.http_port, 8010).")
def ingest_http(config_path: str | None, definitions: str | None, store: str | None,
                redis_url: str | None, host: str, port: int | None) -> None:
    """Serve POST /v1/events (JSON array, object or lines) and GET /v1/ingest/stats.

    \b
    Examples:
      redline ingest http --config redline.yaml                         # :8010
      redline ingest http -d features.py --redis-url redis://127.0.0.1:6379/0 --http-port 8011
    """
    import uvicorn

    from redline.features.ingest import Ingestor, events_asgi_app
    from redline.features.online import open_online_store
    from redline.serving.http_protocol import HttpLimits, RedlineHttpProtocol

    fs, defs = feature_settings(config_path, definitions, store, redis_url,
                                sessions_only=True)
    online = open_online_store(fs, timeout_ms=fs.ingest_timeout_ms)
    online.ping()
    app = events_asgi_app(Ingestor(defs, online, dead_stream=f"{fs.stream}:dead",
                                   sessions=_session_writer(config_path, online)))
    click.echo(f"ingest: POST http://{host}:{port or fs.http_port}/v1/events into the "
               f"{fs.store} store ({len(defs.views)} views)", err=True)
    # The serving edge's protocol: the server.* limits on header size and count, slow
    # clients and connections hold here too (an ingest port is as exposed as a serving one).
    limits = HttpLimits.of(load_settings(config_path).server)
    uvicorn.run(app, host=host, port=port or fs.http_port, log_level="warning",
                access_log=False, lifespan="on", http=RedlineHttpProtocol.limited(limits))



