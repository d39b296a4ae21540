"""Point-in-time training sets on Apache Spark, for event logs no single machine holds.

The engine runs the one per-partition kernel (``training.kernel.build_partition``) on each
partition, so a Spark training set answers what the online store answered, by construction: events
and label rows are hashed by entity id into buckets (``groupBy(bucket).cogroup(...).applyInPandas``,
Arrow batches), and every bucket holds all the events and label rows of its entities. The
point-in-time join never looks across entities (an event counts only for its own entity; the
event-id window is per entity), so the rows of a bucket are exactly the rows the whole log would
give.

Views of another entity (a merchant's next to a card's) are another pass keyed by their join key;
the passes meet on a row id, then the request transforms run on the joined rows.

Nothing here assumes a local machine: :func:`session` takes the session ``spark-submit``,
Databricks or EMR made, and :func:`write_parquet` renames through the Hadoop file system of the
output path (HDFS, S3, ABFS, local).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from redline.errors import ConfigError, InvalidInput
from redline.features.definitions import FeatureDefinitions, FeatureView
from redline.features.eventfile import EventLog, text_log
from redline.features.training.kernel import SEQ, apply_transforms, build_partition, feature_plan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ROW = "__redline_row"  # label row id: where the passes of several entities meet
BUCKET = "__redline_bucket"  # entity bucket: the unit of work of one task
JAVA_HELP = ("Spark needs Java 17 or newer. Install it (Debian/Ubuntu: apt-get install "
             "openjdk-17-jre-headless; macOS: brew install openjdk@17) or point JAVA_HOME at one")


def java_problem() -> str | None:
    """Why no usable Java would start Spark's JVM here (``None``: fine); the check PySpark skips
    before failing with a gateway error."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        return f"{JAVA_HELP} ({where})."
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{JAVA_HELP} ({java} does not run: {exc})."
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m:
        major = int(m.group(2) or 0) if m.group(1) == "1" else int(m.group(1))
        if major < 17:
            return f"{JAVA_HELP} ({java} is Java {major})."
    return None


def session(master: str | None = None, *, shuffle_partitions: int | None = None,
            app_name: str = "redline-training-set") -> SparkSession:
    """The active Spark session (the one ``spark-submit``, a Databricks or EMR job made), else a
    new one on ``master`` (default ``local[*]``). A missing Java is a :class:`ConfigError` that
    says how to install it, not a JVM gateway traceback."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ConfigError("the Spark engine needs PySpark: pip install 'redline[spark]'") from exc
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    launched_by_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # the JVM is up already
    if not launched_by_submit:
        problem = java_problem()
        if problem:
            raise ConfigError(problem)
    builder = SparkSession.builder.appName(app_name)
    local = (master or "local").startswith("local") and not launched_by_submit
    if master or not launched_by_submit:
        builder = builder.master(master or "local[*]")
    if local:
        # local workers run this interpreter (its packages), not whatever python3 is on PATH
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if shuffle_partitions or local:  # Spark's 200 are 200 Python tasks: seconds on a laptop
        parts = shuffle_partitions or 2 * (os.cpu_count() or 2)
        builder = builder.config("spark.sql.shuffle.partitions", str(parts))
    if local:
        builder = builder.config("spark.ui.enabled", "false")
    builder = builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
    try:
        return builder.getOrCreate()
    except Exception as exc:  # PySpark raises its own runtime errors when the JVM fails
        if "JAVA_GATEWAY" in str(exc) or "Java gateway" in str(exc):
            raise ConfigError(f"{JAVA_HELP} ({exc}).") from exc
        raise


def read_events(spark: SparkSession, path: str) -> tuple[DataFrame, str]:
    """An event file or folder as Spark reads it, and how rows become events: ``"frame"``
    (Parquet: typed columns), ``"json"`` (one JSON text per row, parsed by the decoder, as over
    HTTP), ``"text"`` (CSV: every cell text, like a Redis Stream entry)."""
    suffix = Path(path.rstrip("/")).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return spark.read.parquet(path), "frame"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return spark.read.text(path).filter("trim(value) != ''"), "json"
    if suffix == ".csv":
        return spark.read.option("header", True).csv(path), "text"
    raise InvalidInput(f"{path}: unknown event file format '{suffix}' (use .jsonl, .csv or "
                       ".parquet)")


def read_labels(spark: SparkSession, path: str, text_columns: Collection[str] = ()
                ) -> DataFrame:
    """A label table (Parquet, JSON lines, CSV with a header) as a Spark DataFrame. The CSV
    columns in ``text_columns`` (entity ids: ``007`` is not ``7``) are text, the others typed
    as Spark infers them."""
    suffix = Path(path.rstrip("/")).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return spark.read.parquet(path)
    if suffix in (".jsonl", ".ndjson", ".json"):
        return spark.read.json(path)
    if suffix == ".csv":
        from pyspark.sql.types import StringType, StructField, StructType

        inferred = spark.read.option("header", True).option("inferSchema", True).csv(path)
        schema = StructType([StructField(f.name, StringType()) if f.name in text_columns else f
                             for f in inferred.schema.fields])
        return spark.read.option("header", True).schema(schema).csv(path)
    raise InvalidInput(f"{path}: unknown table format '{suffix}' (use .jsonl, .csv or .parquet)")


def training_set(defs: FeatureDefinitions, events: DataFrame, labels: DataFrame,
                 features: Sequence[str] | None = None, *, time_column: str = "ts",
                 events_as: str = "frame", buckets: int | None = None) -> DataFrame:
    """``labels`` + one double column per feature / transform, point-in-time correct: the rows
    :func:`redline.features.training.kernel.build_partition` gives on the whole input, in no
    particular order.

    ``events``: typed columns (``events_as="frame"``), or one column ``value`` of JSON text
    (``"json"``) or all-text columns (``"text"``), see :func:`read_events`. ``buckets``: entity
    buckets, the tasks of each pass (default ``spark.sql.shuffle.partitions``); every bucket's
    events are held in one Python worker, so a log of billions wants thousands."""
    from pyspark.sql import functions as F

    if events_as not in ("frame", "json", "text"):
        raise InvalidInput(f"events_as must be frame, json or text, not {events_as!r}")
    if time_column not in labels.columns:
        raise InvalidInput(f"labels lack the time column '{time_column}'")
    for reserved in (ROW, BUCKET):
        if reserved in labels.columns:
            raise InvalidInput(f"labels have the reserved column '{reserved}': rename it")
    if SEQ in events.columns:
        raise InvalidInput(f"events have the reserved column '{SEQ}': rename it")
    refs, view_refs, transforms = feature_plan(defs, features)
    views = [defs.view(name) for name in view_refs]
    n = buckets or int(events.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
    _pickle_user_code(defs)
    labels = labels.withColumn(ROW, F.monotonically_increasing_id())
    events = events.withColumn(SEQ, F.monotonically_increasing_id())
    all_sources = {v.source.name for v in views}
    by_key: dict[str, list[FeatureView]] = {}
    for view in views:
        by_key.setdefault(view.entity.join_key, []).append(view)
    result = labels
    for key, key_views in by_key.items():
        if key not in labels.columns:
            raise InvalidInput(f"labels lack column '{key}' (entity '{key_views[0].entity.name}' "
                               f"id) needed by view '{key_views[0].name}'")
        key_refs = [ref for v in key_views for ref, _ in view_refs[v.name]]
        sources = {v.source.name for v in key_views}
        part = _pass(defs, events, events_as, labels, key, key_refs, time_column, n,
                     None if len(all_sources) == 1 else sources)
        result = result.join(part, ROW, "left")
    out_cols = list(labels.columns) + [r for r in refs if r not in defs.transforms]
    if transforms:
        result = _with_transforms(result, transforms)
        out_cols += [tr.name for tr in transforms]
    return result.select(*[F.col(f"`{c}`") for c in out_cols if c != ROW])


def _pass(defs: FeatureDefinitions, events: DataFrame, events_as: str, labels: DataFrame,
          key: str, key_refs: list[str], time_column: str, n: int,
          sources: set[str] | None) -> DataFrame:
    """(row id, the values of ``key_refs``) of every label row: events and labels of one join
    key, cogrouped by entity bucket, each bucket built by the kernel."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    if sources is not None:  # several sources: an event names its own (else it is dead-lettered)
        src = _event_field(events, events_as, "source")
        events = (events.filter(src.isin(sorted(sources))) if src is not None
                  else events.limit(0))
    ev_key = _event_field(events, events_as, key)
    ev = events.withColumn(BUCKET, _bucket(ev_key if ev_key is not None else F.lit(None), n))
    lab = labels.select(ROW, F.col(f"`{key}`").alias(key), F.col(f"`{time_column}`")
                        .alias(time_column))
    lab = lab.withColumn(BUCKET, _bucket(_label_key(lab, key), n))
    schema = StructType([StructField(ROW, LongType(), False)]
                        + [StructField(r, DoubleType(), True) for r in key_refs])

    def build(evs: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
        if rows.empty:
            return pd.DataFrame({c: pd.Series(dtype="int64" if c == ROW else "float64")
                                 for c in [ROW, *key_refs]})
        table = build_partition(defs, _as_events(evs.drop(columns=[BUCKET]), events_as),
                                rows.drop(columns=[BUCKET]), key_refs, time_column=time_column)
        return table[[ROW, *key_refs]]

    return (ev.groupBy(BUCKET).cogroup(lab.groupBy(BUCKET))
            .applyInPandas(build, schema=schema))


def _as_events(evs: pd.DataFrame, events_as: str) -> Any:
    """One bucket's events as the kernel takes them (see :func:`read_events`): a frame keeps its
    log position column (the kernel restores the order), a log is put in order here."""
    if events_as != "frame":
        evs = evs.sort_values(SEQ, kind="stable").drop(columns=[SEQ])
    if events_as == "json":
        return EventLog([s.encode() for s in evs["value"].tolist()])
    if events_as == "text":
        return text_log(evs)
    return evs.reset_index(drop=True)


def _event_field(events: DataFrame, events_as: str, name: str) -> Column | None:
    """An event field as text for routing (entity id, source); ``None`` when no event has it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, NumericType, StringType

    if events_as == "json":
        return F.get_json_object(F.col("value"), "$." + name)
    if name not in events.columns:
        return None
    typ = events.schema[name].dataType
    if isinstance(typ, StringType):
        return F.col(f"`{name}`")
    if isinstance(typ, NumericType) and not isinstance(typ, BooleanType):
        return F.col(f"`{name}`").cast("string")
    return F.lit(None).cast("string")  # the decoder takes no such id: the bucket does not matter


def _label_key(lab: DataFrame, key: str) -> Column:
    """A label row's entity id as the builder reads it: integer-like floats (an id column with
    gaps) are integers, ``42.0`` is entity ``"42"``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    c = F.col(f"`{key}`")
    if isinstance(lab.schema[key].dataType, DoubleType | FloatType):
        return F.when(c == F.floor(c), c.cast("long").cast("string")).otherwise(c.cast("string"))
    return c.cast("string")


def _bucket(entity: Column, n: int) -> Column:
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(entity), F.lit(n))


def _with_transforms(result: DataFrame, transforms: Sequence[Any]) -> DataFrame:
    """Request transforms over the joined rows, by the kernel's own function."""
    from pyspark.sql.types import DoubleType, StructField, StructType

    schema = StructType(list(result.schema.fields)
                        + [StructField(tr.name, DoubleType(), True) for tr in transforms])

    def apply(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in batches:
            computed = {f: pdf[f].to_numpy(dtype=np.float64) for tr in transforms
                        for f in tr.features}
            apply_transforms(pdf, transforms, computed)
            yield pdf

    for tr in transforms:
        absent = [c for c in tr.request if c not in result.columns]
        if absent:
            raise InvalidInput(f"transform '{tr.name}' needs request field(s) {absent} as label "
                               "columns")
    return result.mapInPandas(apply, schema=schema)


def _pickle_user_code(defs: FeatureDefinitions) -> None:
    """Ship the user's transform functions by value: a definitions file loaded by path is no
    module the executors can import."""
    from pyspark import cloudpickle

    for tr in defs.transforms.values():
        name = getattr(tr.fn, "__module__", None)  # a user callable may have none
        module = sys.modules.get(name) if name else None
        if module is not None and name and not name.startswith(("redline.", "builtins", "numpy")):
            cloudpickle.register_pickle_by_value(module)


def write_parquet(table: DataFrame, out: str) -> str:
    """Write ``table`` as a Parquet folder at ``out``: into a temporary sibling first, then one
    rename, so a failed job leaves nothing half-written (a previous ``out`` is replaced only by
    a complete one)."""
    spark = table.sparkSession
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    target = jvm.org.apache.hadoop.fs.Path(out)
    fs = target.getFileSystem(conf)
    tmp = jvm.org.apache.hadoop.fs.Path(target.getParent(),
                                        f".{target.getName()}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        table.write.parquet(tmp.toString())
    except Exception as exc:
        fs.delete(tmp, True)
        raise _user_error(exc) from exc
    if fs.exists(target):
        fs.delete(target, True)
    if not fs.rename(tmp, target):
        fs.delete(tmp, True)
        raise InvalidInput(f"cannot move the training set into place at {out}")
    return out


def _user_error(exc: Exception) -> Exception:
    """An input error raised inside a Spark task, as the builder's own error (not a JVM trace)."""
    m = re.search(r"redline\.errors\.(InvalidInput|ConfigError): (.+)", str(exc))
    if m:
        return (InvalidInput if m.group(1) == "InvalidInput" else ConfigError)(m.group(2).strip())
    return exc
