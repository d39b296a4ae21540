"""Training sets larger than memory, on one machine: the same kernel over hash partitions on disk.

Layout (a temporary directory, removed at the end whatever happens):

* ``labels/<chunk>.pkl`` — the label rows in chunks of file order, every column, plus ``_row``;
* ``parts/<source>/<p>.ev`` and ``<p>.lb`` — per event source, its events and the (``_row``, id,
  time) of every label row, hashed into partition ``p`` by the entity id *as the decoder reads
  it* (``42`` and ``"42"`` are one entity), appended chunk after chunk so each entity's events keep
  their log order;
* ``out/<source>/<chunk>/<p>.pkl`` — the kernel's feature columns for partition ``p``, split by
  label chunk.

Each (source, partition) is built by :func:`redline.features.training.kernel.build_partition` in a
pool of processes; then each label chunk gets its columns back by ``_row`` and is appended to the
output, which is written to a temporary file renamed onto ``--out`` only when complete. Memory holds
one input chunk while partitioning, one partition per worker while building, one label chunk while
assembling.
"""

from __future__ import annotations

import math
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from redline.errors import InvalidInput
from redline.features.definitions import FeatureDefinitions
from redline.features.event_values import entity_id_of
from redline.features.eventfile import text_log
from redline.features.training.kernel import (
    _label_id,
    apply_transforms,
    build_partition,
    check_milliseconds,
    feature_plan,
)

ROW = "_row"
CHUNK_ROWS = 1_000_000
BYTES_PER_EVENT = 400  # the kernel's peak working memory per event in a partition (measured)
ProgressFn = Callable[[str, int, int], None]


def parse_budget(text: str | int | float) -> int:
    """``"25%"`` (of this machine's RAM), ``"4GB"``, ``"512MB"`` or a number of bytes."""
    s = str(text).strip().upper().replace(" ", "")
    try:
        if s.endswith("%"):
            return int(total_ram() * float(s[:-1]) / 100)
        for unit, mult in (("GB", 1 << 30), ("G", 1 << 30), ("MB", 1 << 20), ("M", 1 << 20),
                           ("KB", 1 << 10), ("K", 1 << 10), ("B", 1)):
            if s.endswith(unit):
                return int(float(s[: -len(unit)]) * mult)
        return int(float(s))
    except ValueError:
        raise InvalidInput(f"memory budget {text!r}: use a share of RAM ('25%') or a size "
                           "('4GB', '512MB')") from None


def total_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _suffix(path: Path) -> str:
    s = path.suffix.lower()
    if s in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if s == ".csv":
        return "csv"
    if s in (".parquet", ".pq"):
        return "parquet"
    raise InvalidInput(f"{path}: unknown table format '{s}' (use .jsonl, .csv or .parquet)")


def count_rows(path: str | Path) -> int:
    """Rows of a table: exact for Parquet (its footer), estimated from the size otherwise."""
    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"file {p} does not exist")
    if _suffix(p) == "parquet":
        import pyarrow.parquet as pq

        try:
            return int(pq.ParquetFile(p).metadata.num_rows)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's to fix
            raise InvalidInput(f"cannot read {p}: {exc}") from exc
    return max(1, p.stat().st_size // 60)


def in_memory_bytes(events_path: str | Path) -> int:
    """What building ``events_path`` in memory would take, about."""
    return count_rows(events_path) * BYTES_PER_EVENT


def read_chunks(path: str | Path, rows: int = CHUNK_ROWS, text_columns: Collection[str] = (),
                all_text: bool = False) -> Iterator[pd.DataFrame]:
    """A table in chunks of file order, each typed as ``offline.read_table`` types the whole.
    CSV: ``text_columns`` are read as text; with ``all_text`` every cell, as ``read_events``
    reads events (an empty cell is ``""``)."""
    import orjson

    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"file {p} does not exist")
    kind = _suffix(p)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            f = pq.ParquetFile(p)
            for batch in f.iter_batches(batch_size=rows):
                yield batch.to_pandas()
        elif kind == "csv" and all_text:
            yield from pd.read_csv(p, chunksize=rows, dtype=str, keep_default_na=False)
        elif kind == "csv":
            yield from pd.read_csv(p, chunksize=rows,
                                   dtype={c: str for c in text_columns} or None)
        else:
            buf: list[Any] = []
            with p.open("rb") as fh:
                for ln in fh:
                    if ln.strip():
                        buf.append(orjson.loads(ln))
                    if len(buf) >= rows:
                        yield pd.DataFrame(buf)
                        buf = []
            if buf:
                yield pd.DataFrame(buf)
    except (ValueError, OSError, orjson.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read {p}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors: a corrupt or foreign file
        if type(exc).__module__.startswith("pyarrow"):
            raise InvalidInput(f"cannot read {p}: {exc}") from exc
        raise


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of int64 values: a cheap hash that spreads consecutive ids."""
    with np.errstate(over="ignore"):
        z = x.astype(np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _as_int(text: str | None) -> int | None:
    """The integer whose decimal text ``text`` is exactly (``"42"``; not ``"042"``, ``"+4"``)."""
    if not text or not (text[0].isdigit() or text[0] == "-"):
        return None
    try:
        v = int(text)
    except ValueError:
        return None
    return v if str(v) == text and -(2**63) <= v < 2**63 else None


def _hash_texts(texts: list[str | None], parts: int) -> np.ndarray:
    """Partition of each id text: an integer's text goes where the integer goes."""
    ints = [_as_int(t) for t in texts]
    is_int = np.fromiter((v is not None for v in ints), dtype=bool, count=len(ints))
    out = np.empty(len(texts), dtype=np.uint64)
    out[is_int] = _mix(np.array([v for v in ints if v is not None], dtype=np.int64))
    if not is_int.all():
        other = np.array(["" if t is None else t for t, ok in zip(texts, is_int.tolist(),
                                                                     strict=True) if not ok],
                         dtype=object)
        out[~is_int] = pd.util.hash_array(other, categorize=False)
    return (out % np.uint64(parts)).astype(np.int64)


def partition_of(col: pd.Series, parts: int, labels: bool) -> np.ndarray:
    """The partition of each row's entity, from its id as the kernel reads it (events:
    ``entity_id_of``; labels: whole floats are ints). Rows without a valid id go anywhere."""
    a = col.to_numpy()
    kind = a.dtype.kind if isinstance(a, np.ndarray) else "O"
    if kind in "iu" and not (kind == "u" and len(a) and a.max() >= 2**63):
        return (_mix(a) % np.uint64(parts)).astype(np.int64)
    if kind == "f" and not labels:
        return np.zeros(len(a), dtype=np.int64)  # a float is no entity id: dropped anyway
    if labels:
        return _hash_texts([_label_id(v) for v in col.tolist()], parts)
    return _hash_texts([entity_id_of(v) for v in col.tolist()], parts)


@dataclass
class Plan:
    """What to build: per source, its views' feature refs and entity join key."""

    refs: list[str]
    transforms: list[Any]
    sources: dict[str, list[str]] = field(default_factory=dict)  # source -> feature refs
    keys: dict[str, str] = field(default_factory=dict)  # source -> join key
    timestamps: dict[str, str] = field(default_factory=dict)  # source -> event time column


def make_plan(defs: FeatureDefinitions, features: list[str] | None) -> Plan:
    refs, view_refs, transforms = feature_plan(defs, features)
    plan = Plan(refs, transforms)
    for name, pairs in view_refs.items():
        view = defs.view(name)
        src = view.source.name
        plan.sources.setdefault(src, []).extend(r for r, _ in pairs)
        plan.keys[src] = view.entity.join_key
        plan.timestamps[src] = view.source.timestamp
    return plan


def _append(path: Path, frame: pd.DataFrame) -> None:
    with path.open("ab") as fh:
        pickle.dump(frame, fh, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path) -> pd.DataFrame | None:
    if not path.exists():
        return None
    frames = []
    with path.open("rb") as fh:
        while True:
            try:
                frames.append(pickle.load(fh))
            except EOFError:
                break
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _check_event_chunk(chunk: pd.DataFrame, plan: Plan, path: str) -> None:
    for src, ts in plan.timestamps.items():
        if ts in chunk.columns:
            col = chunk[ts]
            if "source" in chunk.columns and len(plan.sources) > 1:
                col = col[(chunk["source"] == src).to_numpy()]
            if col.dtype.kind in "iuf":
                check_milliseconds(col.to_numpy(), f"{path}: event time column '{ts}'")


def _partition_labels(labels_path: str, plan: Plan, tmp: Path, parts: int, time_column: str,
                      progress: ProgressFn) -> list[int]:
    """Label chunks to ``labels/``, (row, id, time) per source to its partitions; chunk sizes."""
    sizes: list[int] = []
    row0 = 0
    for c, chunk in enumerate(read_chunks(labels_path, text_columns=set(plan.keys.values()))):
        chunk = chunk.reset_index(drop=True)
        if time_column not in chunk.columns:
            raise InvalidInput(f"labels lack the time column '{time_column}'")
        if chunk[time_column].dtype.kind in "iuf":
            check_milliseconds(chunk[time_column].to_numpy(), f"labels column '{time_column}'")
        chunk[ROW] = np.arange(row0, row0 + len(chunk), dtype=np.int64)
        row0 += len(chunk)
        sizes.append(len(chunk))
        with (tmp / "labels" / f"{c}.pkl").open("wb") as fh:
            pickle.dump(chunk, fh, protocol=pickle.HIGHEST_PROTOCOL)
        for src in plan.sources:
            key = plan.keys[src]
            if key not in chunk.columns:
                raise InvalidInput(f"labels lack column '{key}' (the entity id) needed by the "
                                   f"features of source '{src}': add it to {labels_path}")
            small = chunk[[ROW, key, time_column]]
            pid = partition_of(small[key], parts, labels=True)
            for p in np.unique(pid).tolist():
                _append(tmp / "parts" / src / f"{p}.lb", small[pid == p])
        progress("labels", len(chunk), 0)
    return sizes


def _partition_events(events_path: str, plan: Plan, tmp: Path, parts: int,
                      progress: ProgressFn) -> int:
    total = 0
    several = len(plan.sources) > 1
    for chunk in read_chunks(events_path, all_text=True):  # CSV: text, as ingest reads it
        _check_event_chunk(chunk, plan, events_path)
        total += len(chunk)
        for src in plan.sources:
            key = plan.keys[src]
            mine = chunk
            if "source" in chunk.columns:
                sel = np.array(chunk["source"] == src, dtype=bool)
                if not several:
                    sel |= np.array(chunk["source"].isna() | (chunk["source"] == ""),
                                    dtype=bool)
                mine = chunk[sel]
            if key not in mine.columns or not len(mine):
                continue
            pid = partition_of(mine[key], parts, labels=False)
            order = np.argsort(pid, kind="stable")
            spid = pid[order]
            bounds = np.flatnonzero(np.r_[True, spid[1:] != spid[:-1], True])
            for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                _append(tmp / "parts" / src / f"{int(spid[s])}.ev",
                        mine.iloc[order[s:e]].reset_index(drop=True))
        progress("events", len(chunk), 0)
    return total


_DEFS: list[FeatureDefinitions] = []  # the definitions, given to forked workers (not pickled)


def _init_worker(defs: FeatureDefinitions) -> None:
    _DEFS[:] = [defs]


def _build_one(args: tuple[Any, ...]) -> int:
    """One (source, partition): the kernel, its columns split by label chunk."""
    tmp, src, p, refs, time_column, chunk_starts, text = args
    defs = _DEFS[0]
    base = Path(tmp) / "parts" / src
    labels = _load(base / f"{p}.lb")
    if labels is None:
        return 0
    frame = _load(base / f"{p}.ev")
    events: Any = pd.DataFrame({"_empty": []}) if frame is None else (
        text_log(frame) if text else frame)  # CSV cells: text, decoded as ingest decodes them
    out = build_partition(defs, events, labels, refs, time_column=time_column)
    res = out[[ROW, *refs]]
    chunk_of = np.searchsorted(np.asarray(chunk_starts), res[ROW].to_numpy(), side="right") - 1
    for c in np.unique(chunk_of).tolist():
        d = Path(tmp) / "out" / src / str(c)
        d.mkdir(parents=True, exist_ok=True)
        with (d / f"{p}.pkl").open("wb") as fh:
            pickle.dump(res[chunk_of == c], fh, protocol=pickle.HIGHEST_PROTOCOL)
    return len(labels)


class TrainingSetWriter:
    """Appends frames to a temporary file next to ``out``; ``commit`` renames it onto ``out``,
    ``abort`` removes it: nothing half-written is ever at ``out`` (every engine writes so)."""

    def __init__(self, out: Path) -> None:
        kind = out.suffix.lower()
        if kind not in (".parquet", ".pq", ".csv"):
            raise InvalidInput(f"--out must end in .parquet or .csv, got {out}")
        self.out, self.csv = out, kind == ".csv"
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part",
                                    dir=out.parent if str(out.parent) else ".")
        os.close(fd)
        self.tmp = Path(name)
        self.pq: Any = None
        self.first = True

    def write(self, frame: pd.DataFrame) -> None:
        if self.csv:
            frame.to_csv(self.tmp, mode="w" if self.first else "a", header=self.first,
                         index=False)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self.pq is None:
                self.pq = pq.ParquetWriter(self.tmp, table.schema)
            elif table.schema != self.pq.schema:
                table = table.cast(self.pq.schema)
            self.pq.write_table(table)
        self.first = False

    def commit(self) -> None:
        if self.pq is not None:
            self.pq.close()
        os.replace(self.tmp, self.out)

    def abort(self) -> None:
        if self.pq is not None:
            self.pq.close()
        self.tmp.unlink(missing_ok=True)


def partitions_for(events_rows: int, budget: int, workers: int) -> int:
    """Enough partitions that every worker's partition fits its share of the budget."""
    per_worker = max(budget // max(workers, 1) // 2, 1 << 20)
    return max(workers, math.ceil(events_rows * BYTES_PER_EVENT / per_worker))


def build_on_disk(defs: FeatureDefinitions, events_path: str, labels_path: str, out_path: str,
                  features: list[str] | None = None, *, time_column: str = "ts",
                  budget: int | None = None, workers: int | None = None,
                  parts: int | None = None, tmp_dir: str | None = None,
                  progress: ProgressFn | None = None) -> tuple[int, int, int]:
    """Build the training set of ``labels_path`` from ``events_path`` into ``out_path`` out of
    core; returns (label rows, columns, events). Nothing is left at ``out_path`` on error."""
    plan = make_plan(defs, features)
    workers = workers or os.cpu_count() or 1
    budget = budget or parse_budget("25%")
    parts = parts or partitions_for(count_rows(events_path), budget, workers)
    report = progress or (lambda stage, n, total: None)
    writer = TrainingSetWriter(Path(out_path))
    tmp = Path(tempfile.mkdtemp(prefix="redline-training-", dir=tmp_dir))
    try:
        (tmp / "labels").mkdir()
        for src in plan.sources:
            (tmp / "parts" / src).mkdir(parents=True)
        sizes = _partition_labels(labels_path, plan, tmp, parts, time_column, report)
        starts = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64).tolist()
        n_events = _partition_events(events_path, plan, tmp, parts, report) if plan.sources \
            else 0
        text = _suffix(Path(events_path)) == "csv"
        tasks = [(str(tmp), src, p, refs, time_column, starts, text)
                 for src, refs in plan.sources.items() for p in range(parts)]
        report("build", 0, len(tasks))
        if workers > 1 and len(tasks) > 1:
            import multiprocessing as mp

            with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"),
                                     initializer=_init_worker, initargs=(defs,)) as pool:
                for _ in pool.map(_build_one, tasks):
                    report("build", 1, len(tasks))
        else:
            _init_worker(defs)
            for t in tasks:
                _build_one(t)
                report("build", 1, len(tasks))
        columns = 0
        for c, size in enumerate(sizes):
            frame = _assemble(tmp, c, plan)
            columns = frame.shape[1]
            writer.write(frame)
            report("write", size, 0)
        if not sizes:
            raise InvalidInput(f"{labels_path} has no label rows")
        writer.commit()
        return sum(sizes), columns, n_events
    except BaseException:
        writer.abort()
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _assemble(tmp: Path, c: int, plan: Plan) -> pd.DataFrame:
    with (tmp / "labels" / f"{c}.pkl").open("rb") as fh:
        labels: pd.DataFrame = pickle.load(fh)
    rows = labels[ROW].to_numpy()
    computed: dict[str, np.ndarray] = {}
    for src, refs in plan.sources.items():
        d = tmp / "out" / src / str(c)
        got = [pd.read_pickle(f) for f in sorted(d.glob("*.pkl"))] if d.exists() else []
        res = pd.concat(got, ignore_index=True) if got else pd.DataFrame(
            {ROW: np.empty(0, np.int64), **{r: np.empty(0) for r in refs}})
        where = np.searchsorted(np.sort(res[ROW].to_numpy()), rows)
        res = res.sort_values(ROW)
        for r in refs:
            computed[r] = res[r].to_numpy(dtype=np.float64)[where]
    result = labels.drop(columns=[ROW]).reset_index(drop=True)
    for ref in plan.refs:
        if ref in computed:
            result[ref] = computed[ref]
    apply_transforms(result, plan.transforms, computed)
    return result
