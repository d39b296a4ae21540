"""``redline features ...``: list, plan, apply, training-set, verify."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from redline.commands._common import config_option
from redline.commands._feature_options import (
    definitions_option,
    feature_settings,
    store_options,
)
from redline.errors import ConfigError, InvalidInput


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
    _, defs = feature_settings(config_path, definitions)
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

    fs, defs = feature_settings(config_path, definitions)
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

    fs, defs = feature_settings(config_path, definitions)
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

    fs, defs = feature_settings(config_path, definitions)
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

    fs, defs = feature_settings(config_path, definitions, store, redis_url)
    if served_path:
        if not events_path:
            raise InvalidInput("--served needs --events (the event log the values came from)")
        rep = verify_served(defs, read_event_table(events_path),
                            read_table(served_path, text_columns=label_keys(defs)))
        _print_report("served", rep)
        sys.exit(0 if rep.ok else 1)
    online = open_online_store(fs, timeout_ms=fs.ingest_timeout_ms)
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
