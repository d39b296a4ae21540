"""``redline features ...`` (plan, apply, list, training-set, verify) and ``redline ingest ...``."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from redline.commands._common import config_option
from redline.config import FeatureSettings, load_settings
from redline.errors import ConfigError, InvalidInput


def _settings(config_path: str | None, definitions: str | None, store: str | None = None,
              redis_url: str | None = None,
              sessions_only: bool = False) -> tuple[FeatureSettings, Any]:
    """Feature settings with the command's overrides, and the definitions they name.

    ``sessions_only``: an ingest without definitions (a recommender with no feature views)
    takes events of source ``session`` only; any other event is a dead letter saying why."""
    from redline.features import load_definitions

    fs = load_settings(config_path).features
    if store:
        fs.store = store
    if redis_url:
        fs.redis_url = redis_url
        fs.store = store or "redis"
    target = definitions or fs.definitions
    if not target and sessions_only:
        from redline.features.definitions import FeatureDefinitions

        click.echo('ingest: no feature definitions: only events of source "session" are '
                   "stored (pass --definitions FILE.py for feature events)", err=True)
        return fs, FeatureDefinitions.of([], origin="no feature definitions")
    if not target:
        raise ConfigError("no feature definitions: pass --definitions FILE.py or set "
                          "features.definitions in redline.yaml")
    return fs, load_definitions(target)


def definitions_option(func: Any) -> Any:
    return click.option("--definitions", "-d", default=None,
                        help="Definitions file or module (default: features.definitions).")(func)


def store_options(func: Any) -> Any:
    func = click.option("--store", type=click.Choice(["memory", "redis"]), default=None,
                        help="Online store (default: features.store).")(func)
    return click.option("--redis-url", default=None,
                        help="Redis URL (default: features.redis_url).")(func)


BULK_TIMEOUT_MS = 10_000.0  # ingest and verify send big batches; serving keeps its short timeout


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
def features() -> None:
    """Feature definitions, versions, training sets and skew verification.

    \b
    Examples:
      redline features plan -d features.py        # what changed against the live versions
      redline features apply -d features.py       # register (new views go live)
      redline features training-set --events events.parquet --labels labels.csv --out train.parquet
      redline features verify --store redis       # online == offline on a random stream
    """


@features.command("list")
@config_option
@definitions_option
def list_views(config_path: str | None, definitions: str | None) -> None:
    """Views, their semantic versions, and each feature's dtype and default.

    \b
    Examples:
      redline features list -d examples/fraud/features.py
      redline features list --config examples/fraud/redline.yaml
    """
    _, defs = _settings(config_path, definitions)
    for name, view in sorted(defs.views.items()):
        click.echo(f"{name}  version {view.version}  entity {view.entity.name} "
                   f"({view.entity.join_key})  source {view.source.name}")
        for row in defs.feature_info():
            if row["ref"].startswith(name + ":"):
                click.echo(f"  {row['ref']:<40} {row['kind']:<9} window {row['window_ms']} ms "
                           f"tile {row['tile_ms']} ms  default {row['default']}")
    for t in defs.transforms.values():
        click.echo(f"transform {t.name}  request {list(t.request)}  features {list(t.features)}")


@features.command("plan")
@config_option
@definitions_option
def plan(config_path: str | None, definitions: str | None) -> None:
    """Show what `apply` would change against the registry.

    \b
    Examples:
      redline features plan -d examples/fraud/features.py
      redline features plan --config examples/fraud/redline.yaml
    """
    from redline.features.versioning import ViewRegistry

    fs, defs = _settings(config_path, definitions)
    for e in ViewRegistry(fs.registry).plan(defs):
        live = e.live or "-"
        click.echo(f"{e.action:<12} {e.view:<24} live {live:<13} -> {e.version}")
        for c in e.changes:
            click.echo(f"    {c}")


@features.command("apply")
@config_option
@definitions_option
@click.option("--switch", is_flag=True,
              help="Also make changed views' new versions live (default: old versions keep "
                   "serving).")
def apply(config_path: str | None, definitions: str | None, switch: bool) -> None:
    """Register every view version; new views go live, changed ones only with --switch.

    \b
    Examples:
      redline features apply -d examples/fraud/features.py
      redline features apply -d examples/fraud/features.py --switch   # changed views go live
    """
    from redline.features.versioning import ViewRegistry

    fs, defs = _settings(config_path, definitions)
    reg = ViewRegistry(fs.registry)
    for e in reg.apply(defs, switch=switch):
        click.echo(f"{e.action:<12} {e.view:<24} {e.version}")
    click.echo(f"live: {json.dumps(reg.live())}")


@features.command("training-set")
@config_option
@definitions_option
@click.option("--events", "events_path", required=True,
              help="Event log (.jsonl, .csv, .parquet; optional _arrival_ms column).")
@click.option("--labels", "labels_path", required=True,
              help="Rows to label: entity id column(s), a time column (epoch ms), anything else.")
@click.option("--out", "out_path", required=True,
              help="Output .parquet or .csv (written to a temporary file, then renamed).")
@click.option("--features", "feature_list", default=None,
              help="Comma-separated view:feature refs and transforms (default: all).")
@click.option("--time-column", default="ts", show_default=True,
              help="Column of --labels with each row's time (epoch ms).")
@click.option("--engine", type=click.Choice(["auto", "memory", "disk", "spark"]), default="auto",
              show_default=True,
              help="memory: one pandas frame; disk: hash partitions by entity on local disk, "
                   "built in parallel (out of core); spark: Apache Spark (redline[spark]); "
                   "auto: memory when the events fit the memory budget, else disk.")
@click.option("--memory-budget", default=None,
              help="Memory the build may use: a share of RAM ('25%') or a size ('4GB') "
                   "(default: features.training_memory_budget, 25%).")
@click.option("--workers", default=None, type=click.IntRange(1),
              help="Processes of the disk engine (default: one per core).")
@click.option("--spark-master", default=None,
              help="Master URL of the spark engine (default: the one spark-submit gave, else "
                   "local[*]). With spark, --out is a Parquet folder.")
def training_set(config_path: str | None, definitions: str | None, events_path: str,
                 labels_path: str, out_path: str, feature_list: str | None,
                 time_column: str, engine: str, memory_budget: str | None,
                 workers: int | None, spark_master: str | None) -> None:
    """Point-in-time training table: each row's features as the online store answered them.

    Every engine runs the same per-entity kernel, so they give the same table. The disk engine
    streams the inputs into partitions under the temporary directory (TMPDIR) and needs about
    twice the event file's size there.

    \b
    Examples:
      redline features training-set -d features.py --events events.jsonl --labels rows.csv \\
          --out train.parquet
      redline features training-set -d features.py --events events.parquet \\
          --labels rows.parquet --features card_activity:count_1h,amount_vs_card_mean --out t.csv
      redline features training-set -d features.py --events year.parquet --labels rows.parquet \\
          --engine disk --memory-budget 4GB --out train.parquet
    """
    from redline.features.outofcore import in_memory_bytes, parse_budget
    from redline.features.schema_checks import check_inputs

    fs, defs = _settings(config_path, definitions)
    t0 = time.perf_counter()
    refs = feature_list.split(",") if feature_list else None
    budget = parse_budget(memory_budget or fs.training_memory_budget)
    check_inputs(defs, refs, events_path, labels_path, time_column)
    if engine == "auto":
        engine = "memory" if in_memory_bytes(events_path) <= budget else "disk"
    if engine == "spark":
        _spark_training_set(defs, events_path, labels_path, out_path, refs, time_column,
                            spark_master)
        rows, cols, n_events = -1, -1, -1
    elif engine == "disk":
        rows, cols, n_events = _disk_training_set(defs, events_path, labels_path, out_path, refs,
                                                  time_column, budget, workers)
    else:
        rows, cols, n_events = _memory_training_set(defs, events_path, labels_path, out_path,
                                                    refs, time_column)
    if rows >= 0:
        click.echo(f"{rows} rows x {cols} columns from {n_events} events in "
                   f"{time.perf_counter() - t0:.2f}s ({engine}) -> {out_path}")
    click.echo(f"view versions: {json.dumps(defs.versions())}")


def _memory_training_set(defs: Any, events_path: str, labels_path: str, out_path: str,
                         refs: list[str] | None, time_column: str) -> tuple[int, int, int]:
    from redline.features.offline import (
        EventLog,
        build_training_set,
        label_keys,
        read_event_table,
        read_table,
    )
    from redline.features.outofcore import TrainingSetWriter

    out = Path(out_path)
    if out.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise InvalidInput(f"--out must end in .parquet or .csv, got {out}")
    events = read_event_table(events_path)  # CSV as text, as `ingest file` reads it
    labels = read_table(labels_path, text_columns=label_keys(defs))
    table = build_training_set(defs, events, labels, refs, time_column=time_column)
    writer = TrainingSetWriter(out)
    try:
        writer.write(table)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return len(table), table.shape[1], len(events.raws if isinstance(events, EventLog)
                                            else events)


def _disk_training_set(defs: Any, events_path: str, labels_path: str, out_path: str,
                       refs: list[str] | None, time_column: str, budget: int,
                       workers: int | None) -> tuple[int, int, int]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from redline.features.outofcore import build_on_disk, count_rows

    total_events = count_rows(events_path)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}"),
                  TimeElapsedColumn(), transient=True, disable=not sys.stderr.isatty()) as bar:
        ids = {"labels": bar.add_task("reading labels", total=None),
               "events": bar.add_task("partitioning events", total=total_events),
               "build": bar.add_task("building partitions", total=None),
               "write": bar.add_task("writing", total=None)}

        def progress(stage: str, n: int, total: int) -> None:
            if total:
                bar.update(ids[stage], total=total)
            bar.advance(ids[stage], n)

        return build_on_disk(defs, events_path, labels_path, out_path, refs,
                             time_column=time_column, budget=budget, workers=workers,
                             progress=progress)


def _spark_training_set(defs: Any, events_path: str, labels_path: str, out_path: str,
                        refs: list[str] | None, time_column: str, master: str | None) -> None:
    """The training set on Spark, written as a Parquet folder (all of it or nothing)."""
    import importlib

    try:
        engine = importlib.import_module("redline.features.spark")
    except ImportError as exc:
        raise ConfigError(f"engine spark needs redline[spark] (pip install 'redline[spark]'): "
                          f"{exc}") from exc
    if not out_path.rstrip("/").lower().endswith((".parquet", ".pq")):
        raise InvalidInput(f"with --engine spark, --out is a Parquet folder ending in .parquet, "
                           f"got {out_path}")
    t0 = time.perf_counter()
    session = engine.session(master)
    events, events_as = engine.read_events(session, events_path)
    from redline.features.offline import label_keys

    labels = engine.read_labels(session, labels_path, label_keys(defs))
    table = engine.training_set(defs, events, labels, refs, time_column=time_column,
                                events_as=events_as)
    engine.write_parquet(table, out_path)
    click.echo(f"{len(table.columns)} columns on Spark ({session.sparkContext.master}) in "
               f"{time.perf_counter() - t0:.2f}s -> {out_path}")


@features.command("verify")
@config_option
@definitions_option
@store_options
@click.option("--events-per-view", default=1500, show_default=True,
              help="Random events generated per view.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random stream.")
@click.option("--served", "served_path", default=None,
              help="Log of values actually served (entity id, ts, view:feature columns); with "
                   "--events, recompute each offline and report mismatches per feature.")
@click.option("--events", "events_path", default=None, help="Event log for --served.")
def verify(config_path: str | None, definitions: str | None, store: str | None,
           redis_url: str | None, events_per_view: int, seed: int, served_path: str | None,
           events_path: str | None) -> None:
    """Prove online == offline: replay a random stream (out-of-order and late events) into the
    store, read at random times and entities, compare with the offline builder.

    \b
    Examples:
      redline features verify -d examples/fraud/features.py               # memory store
      redline features verify -d examples/fraud/features.py --redis-url redis://127.0.0.1:6379/0
      redline features verify -d features.py --served served.csv --events events.jsonl
    """
    from redline.features.offline import label_keys, read_event_table, read_table
    from redline.features.online import open_online_store
    from redline.features.verify import verify_served, verify_store

    fs, defs = _settings(config_path, definitions, store, redis_url)
    if served_path:
        if not events_path:
            raise InvalidInput("--served needs --events (the event log the values came from)")
        rep = verify_served(defs, read_event_table(events_path),
                            read_table(served_path, text_columns=label_keys(defs)))
        _print_report("served", rep)
        sys.exit(0 if rep.ok else 1)
    online = open_online_store(fs, timeout_ms=BULK_TIMEOUT_MS)
    online.ping()
    reports = verify_store(online, defs, events_per_view=events_per_view, seed=seed)
    for name, rep in reports.items():
        _print_report(f"{name} ({fs.store})", rep)
    sys.exit(0 if all(r.ok for r in reports.values()) else 1)


def _print_report(name: str, rep: Any) -> None:
    status = "OK" if rep.ok else "MISMATCH"
    click.echo(f"{status} {name}: {rep.rows} reads, {rep.values} values compared")
    for ref, n in sorted(rep.mismatches.items()):
        click.echo(f"  {ref}: {n} mismatches")
    for ex in rep.examples:
        click.echo(f"  e.g. {json.dumps(ex)}")


# --- ingest ------------------------------------------------------------------------------------

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

    fs, defs = _settings(config_path, definitions, "redis", redis_url,
                         sessions_only=True)
    store = open_online_store(fs, timeout_ms=BULK_TIMEOUT_MS)
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


def _run(source: Any, max_events: int | None, stats_every: float, running: str) -> None:
    """The library's loop (``features.ingest.run_source``), stopped by SIGTERM or Ctrl-C.

    SIGTERM is taken over before the ``running`` line is printed: a stop sent once that line
    shows (an orchestrator's, a test's) always ends in a clean exit."""
    from redline.features.ingest import run_source
    from redline.monitoring.ingest import metered

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    source = metered(source)  # ingest metrics, when the server's metrics directory is shared
    click.echo(running, err=True)
    try:
        stats = run_source(source, stop=lambda: bool(stopping), max_events=max_events,
                           stats_every=stats_every, log=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        source.flush()
        stats = source.stats()
    source.close()
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

    fs, defs = _settings(config_path, definitions, "redis", redis_url,
                         sessions_only=True)
    config = dict(fs.kafka_config)
    for opt in kafka_options:
        key, sep, value = opt.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--kafka-option must be KEY=VALUE, got {opt!r}")
        config[key] = value
    store = open_online_store(fs, timeout_ms=BULK_TIMEOUT_MS)
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

    fs, defs = _settings(config_path, definitions, "redis", redis_url,
                         sessions_only=True)
    store = open_online_store(fs, timeout_ms=BULK_TIMEOUT_MS)
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

    fs, defs = _settings(config_path, definitions, store, redis_url,
                         sessions_only=True)
    online = open_online_store(fs, timeout_ms=BULK_TIMEOUT_MS)
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
@click.option("--port", "legacy_port", type=click.IntRange(0, 65535), default=None,
              hidden=True)  # the old name
def ingest_http(config_path: str | None, definitions: str | None, store: str | None,
                redis_url: str | None, host: str, port: int | None,
                legacy_port: int | None) -> None:
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

    port = port if port is not None else legacy_port
    fs, defs = _settings(config_path, definitions, store, redis_url,
                         sessions_only=True)
    online = open_online_store(fs, timeout_ms=BULK_TIMEOUT_MS)
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


