"""Point-in-time training sets: each label row gets the features the online store would have
answered at its timestamp, computed with ``tiles.py`` and the same admission rules as ingest.

An event counts for a row at time ``t`` of entity ``e`` when it is ``e``'s, was admitted (not
late, not from the future, well-formed), had *arrived* by ``t`` (``_arrival_ms`` column; without
it, arrival = event time) and its tile is among the tiles a read at ``t`` covers. Rows are joined
to events in DuckDB (a range join per window; chosen over pandas ``merge_asof`` because windows
need both edges and the arrival condition — see ``benchmarks/features/offline_bench.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from redline.errors import InvalidInput
from redline.features.aggregates import hll_position
from redline.features.definitions import FeatureDefinitions, FeatureView
from redline.features.tiles import TileWindow, admitted_array

ARRIVAL = "_arrival_ms"


def read_table(path: str | Path) -> pd.DataFrame:
    """JSONL, CSV or Parquet → DataFrame (by extension)."""
    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"file {p} does not exist")
    suffix = p.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson", ".json"):
            return pd.read_json(p, lines=True, dtype=False)
        if suffix == ".csv":
            return pd.read_csv(p)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(p)
    except (ValueError, OSError) as exc:
        raise InvalidInput(f"cannot read {p}: {exc}") from exc
    raise InvalidInput(f"{p}: unknown table format '{suffix}' (use .jsonl, .csv or .parquet)")


def _admitted(view: FeatureView, events: pd.DataFrame) -> pd.DataFrame:
    """The view's events that ingest would have admitted, with ts, arrival, id, seq columns."""
    src = view.source
    ev = events
    if "source" in ev.columns:
        ev = ev[ev["source"].isna() | (ev["source"] == src.name)]
    need = [src.timestamp, src.entity.join_key] + sorted(
        {a.field for a in view.features if a.field})
    missing = [c for c in need if c not in ev.columns]
    if missing:
        raise InvalidInput(f"events lack column(s) {missing} needed by view '{view.name}'")
    out = pd.DataFrame({"seq": np.arange(len(ev), dtype=np.int64)}, index=ev.index)
    ts = ev[src.timestamp]
    if not pd.api.types.is_numeric_dtype(ts):
        parsed = pd.to_datetime(ts, utc=True, errors="coerce", format="ISO8601")
        ts = pd.Series(parsed.astype("int64") // 1_000_000, index=ev.index).where(parsed.notna())
    out["ts"] = pd.to_numeric(ts, errors="coerce")
    arr = ev[ARRIVAL] if ARRIVAL in ev.columns else out["ts"]
    out["arrival"] = pd.to_numeric(arr, errors="coerce")
    ids = ev[src.entity.join_key]
    if pd.api.types.is_integer_dtype(ids) or pd.api.types.is_string_dtype(ids) and not (
            ids.dtype == object):
        out["eid"] = ids.astype(str).where(ids.notna() & (ids.astype(str) != ""))
    else:  # mixed objects: the same rules as the ingest decoder, element by element
        out["eid"] = ids.map(lambda x: str(x) if isinstance(x, str | int | np.integer)
                             and x != "" and not isinstance(x, bool) else None)
    ok = out["ts"].notna() & out["arrival"].notna() & out["eid"].notna()
    types = src.field_types()
    for f in need[2:]:
        if types[f] in ("int", "float", "bool"):
            col = ev[f]
            if types[f] == "bool":
                valid = col.map(lambda x: isinstance(x, bool | np.bool_))
                out[f] = col.where(valid).astype("float64")
            elif pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
                num = col.astype("float64")  # a typed column: no per-element checks needed
                valid = num.notna() & np.isfinite(num)
                if types[f] == "int":
                    valid &= (num == np.floor(num))
                out[f] = num.where(valid)
            else:
                num = pd.to_numeric(col, errors="coerce")
                is_bool = col.map(lambda x: isinstance(x, bool | np.bool_))
                valid = num.notna() & np.isfinite(num) & ~is_bool
                if types[f] == "int":
                    valid &= col.map(lambda x: not isinstance(x, float) or float(x).is_integer())
                out[f] = num.where(valid).astype("float64")
            ok &= out[f].notna()
        else:
            out[f] = ev[f]
            if ev[f].dtype != object and pd.api.types.is_string_dtype(ev[f]):
                ok &= ev[f].notna()
            else:
                ok &= ev[f].map(lambda x: isinstance(x, str))
    out = out[ok].copy()
    out["ts"] = out["ts"].astype(np.int64)
    out["arrival"] = out["arrival"].astype(np.int64)
    out = out[admitted_array(out["ts"].to_numpy(), out["arrival"].to_numpy(), src.lateness_ms,
                             src.skew_ms)]
    return out.reset_index(drop=True)


def _view_features(view: FeatureView, ev: pd.DataFrame, rows: pd.DataFrame, con: Any
                   ) -> np.ndarray:
    """(n_rows, n_outputs) float64 values of one view."""
    lay = view.layout()
    n = len(rows)
    out = np.empty((n, len(lay.outputs)), dtype=np.float64)
    con.register("rows_df", rows)
    merged: dict[int, dict[str, np.ndarray]] = {}
    for w in lay.windows:
        g = lay.groups[w.gid]
        win: TileWindow = w.window
        e = pd.DataFrame({"eid": ev["eid"], "arrival": ev["arrival"],
                          "tile": win.tile_of_array(ev["ts"].to_numpy()),
                          "ord": np.lexsort((ev["seq"].to_numpy(), ev["ts"].to_numpy()))
                          .argsort().astype(np.int64)})
        lo, hi = win.covering_array(rows["t"].to_numpy())
        r = pd.DataFrame({"rid": rows["rid"], "eid": rows["eid"], "t": rows["t"],
                          "lo": lo, "hi": hi})
        con.register("r_df", r)
        if g.hll:
            codes, uniques = pd.factorize(ev[g.field])
            pos = np.array([hll_position(v) for v in uniques], dtype=np.int64).reshape(-1, 2)
            e["reg"] = pos[codes, 0]
            e["rank"] = pos[codes, 1]
            con.register("e_df", e)
            res = con.execute("""
                SELECT r.rid, e.reg, max(e.rank) AS rk FROM r_df r JOIN e_df e
                  ON e.eid = r.eid AND e.arrival <= r.t AND e.tile BETWEEN r.lo AND r.hi
                GROUP BY r.rid, e.reg""").fetchnumpy()
            regs = np.zeros((n, 256), dtype=np.float64)
            regs[res["rid"].astype(np.int64), res["reg"].astype(np.int64)] = res["rk"]
            z = np.sum(np.ldexp(1.0, -regs.astype(np.int64)), axis=1)
            zeros = np.sum(regs == 0, axis=1)
            alpha = 0.7213 / (1.0 + 1.079 / 256)
            est = alpha * 256 * 256 / z
            with np.errstate(divide="ignore"):
                lin = 256 * np.log(256 / np.maximum(zeros, 1))
            merged[w.wid] = {"distinct": np.where((est <= 2.5 * 256) & (zeros > 0), lin, est)}
            continue
        x = ev[g.field].to_numpy(dtype=np.float64) if g.field else np.zeros(len(ev))
        e["x"] = x
        con.register("e_df", e)
        res = con.execute("""
            SELECT r.rid, count(*) AS n, fsum(e.x) AS s, min(e.x) AS mn, max(e.x) AS mx,
                   arg_max(e.x, e.ord) AS lv, var_pop(e.x) AS var
            FROM r_df r JOIN e_df e
              ON e.eid = r.eid AND e.arrival <= r.t AND e.tile BETWEEN r.lo AND r.hi
            GROUP BY r.rid""").fetchnumpy()
        rid = res["rid"].astype(np.int64)
        cols = {}
        for name in ("n", "s", "mn", "mx", "lv", "var"):
            arr = np.full(n, np.nan)
            arr[rid] = np.asarray(res[name], dtype=np.float64)
            cols[name] = arr
        cols["n"] = np.nan_to_num(cols["n"], nan=0.0)
        merged[w.wid] = cols
    for i, o in enumerate(lay.outputs):
        m = merged[o.wid]
        if o.kind == "distinct":
            out[:, i] = m["distinct"]
            continue
        cnt = m["n"]
        with np.errstate(all="ignore"):
            val = {
                "count": lambda m=m: m["n"],
                "sum": lambda m=m: np.nan_to_num(m["s"], nan=0.0),
                "mean": lambda m=m: m["s"] / m["n"],
                "min": lambda m=m: m["mn"], "max": lambda m=m: m["mx"],
                "last": lambda m=m: m["lv"],
                "stddev": lambda m=m: np.sqrt(np.maximum(m["var"], 0.0)),
            }[o.kind]()
        if o.kind not in ("count", "sum"):
            val = np.where(cnt > 0, val, o.default)
        out[:, i] = val
    return out


def build_training_set(
    defs: FeatureDefinitions, events: pd.DataFrame, labels: pd.DataFrame,
    features: Sequence[str] | None = None, *, time_column: str = "ts",
) -> pd.DataFrame:
    """``labels`` (entity id column(s) named by join key, ``time_column`` in epoch ms, anything
    else passed through) + one float64 column per feature / transform, point-in-time correct."""
    import duckdb

    if time_column not in labels.columns:
        raise InvalidInput(f"labels lack the time column '{time_column}'")
    refs = list(features) if features is not None else (
        [v.ref(f) for v in defs.views.values() for f in v.feature_names] + list(defs.transforms))
    view_refs: dict[str, list[tuple[str, int]]] = {}
    transforms = []
    for ref in refs:
        if ref in defs.transforms:
            transforms.append(defs.transforms[ref])
            continue
        view, idx = defs.resolve(ref)
        view_refs.setdefault(view.name, []).append((ref, idx))
    for t in transforms:
        for ref in t.features:
            view, idx = defs.resolve(ref)
            if (ref, idx) not in view_refs.setdefault(view.name, []):
                view_refs[view.name].append((ref, idx))
    result = labels.reset_index(drop=True).copy()
    t = pd.to_numeric(result[time_column], errors="coerce")
    if t.isna().any():
        raise InvalidInput(f"labels column '{time_column}' must be epoch milliseconds")
    con = duckdb.connect()
    computed: dict[str, np.ndarray] = {}
    for vname, wanted in view_refs.items():
        view = defs.view(vname)
        key = view.entity.join_key
        if key not in result.columns:
            raise InvalidInput(f"labels lack column '{key}' (entity '{view.entity.name}' id) "
                               f"needed by view '{vname}'")
        rows = pd.DataFrame({"rid": np.arange(len(result), dtype=np.int64),
                             "eid": result[key].astype(str), "t": t.astype(np.int64)})
        ev = _admitted(view, events)
        vals = _view_features(view, ev, rows, con)
        for ref, idx in wanted:
            computed[ref] = vals[:, idx]
    for ref in refs:
        if ref in computed:
            result[ref] = computed[ref]
    for tr in transforms:
        absent = [c for c in tr.request if c not in result.columns]
        if absent:
            raise InvalidInput(f"transform '{tr.name}' needs request field(s) {absent} as label "
                               "columns")
        cols = [pd.to_numeric(result[c], errors="coerce").to_numpy(dtype=np.float64)
                for c in tr.request] + [computed[f] for f in tr.features]
        result[tr.name] = tr.compute(cols)
    return result


def isclose(a: float, b: float, rel: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """The skew tolerance: exact for integers, 1e-9 relative for floats (NaN equals NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)
