"""Skew verification: replay a random stream into an online store, read it at random times,
and compare every value with the offline builder — or compare a log of values actually served.

Counts must be equal exactly; other values within 1e-9 relative (NaN equals NaN).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from redline.errors import InvalidInput
from redline.features.definitions import EventSource, FeatureDefinitions, FeatureView
from redline.features.events import EventDecoder
from redline.features.offline import ARRIVAL, EventLog, build_training_set, isclose


@dataclass
class VerifyReport:
    rows: int = 0
    values: int = 0
    mismatches: dict[str, int] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def random_events(source: EventSource, n: int, seed: int, start_ms: int,
                  entities: int = 8, lateness_share: float = 0.07, id_prefix: str = "e"
                  ) -> list[dict[str, Any]]:
    """Events in arrival order: mostly on time, some out of order, some too late, some from the
    future (beyond the allowed clock skew), equal event times, tile-boundary times, duplicate
    deliveries (the same event again, later), tiny and huge values."""
    rng = random.Random(seed)
    lateness, skew = source.lateness_ms, source.skew_ms
    types = source.field_types()
    t = float(start_ms)
    out: list[dict[str, Any]] = []
    for i in range(n):
        t += rng.expovariate(1 / 250)
        arrival = int(t)
        if out and rng.random() < 0.04:  # a duplicate delivery of an earlier event
            out.append({**rng.choice(out[-20:]), ARRIVAL: arrival})
            continue
        u = rng.random()
        if u < 0.62:
            ts = arrival - rng.randint(0, 50)
        elif u < 0.67 and out:
            ts = int(out[-1][source.timestamp])  # a tie in event time
        elif u < 0.72:
            ts = arrival - arrival % 5000  # on a tile boundary
        elif u < 0.88:
            ts = arrival - rng.randint(0, max(1, lateness))
        elif u < 0.88 + lateness_share:
            ts = arrival - lateness - rng.randint(1, max(2, 2 * lateness))
        else:
            ts = arrival + rng.randint(0, 3 * max(skew, 1))
        # the join key is the entity's, whether or not the schema lists it
        ev: dict[str, Any] = {"source": source.name, source.timestamp: ts, ARRIVAL: arrival,
                              source.entity.join_key: f"{id_prefix}{rng.randrange(entities)}"}
        if source.event_id:
            ev[source.event_id] = f"{id_prefix}ev{seed}-{i}"
        for name, typ in types.items():
            if name in (source.entity.join_key, source.timestamp, source.event_id):
                continue
            if typ == "float":
                x = rng.random()
                ev[name] = (rng.choice([1e300, -1e300, 1e-300, 5e-324]) if x < 0.02 else
                            round(rng.uniform(-50, 500), rng.choice([0, 2, 6])))
            elif typ == "int":
                ev[name] = rng.randrange(100)
            elif typ == "bool":
                ev[name] = rng.random() < 0.5
            else:
                ev[name] = f"v{rng.randrange(40)}"
        out.append(ev)
    return out


def replay_and_read(store: Any, defs: FeatureDefinitions, view: FeatureView,
                    events: list[dict[str, Any]], seed: int, reads_per_chunk: int = 2
                    ) -> list[tuple[str, int, np.ndarray]]:
    """Ingest in arrival order, in random chunks (never splitting one arrival millisecond);
    between chunks read random entities at random times before the next arrival."""
    rng = random.Random(seed + 1)
    decoder = EventDecoder(defs, view.source.name)
    reader = store.reader([view])
    key = view.entity.join_key
    ids = sorted({str(e[key]) for e in events}) + ["never-seen"]
    reads: list[tuple[str, int, np.ndarray]] = []
    i = 0
    while i < len(events):
        j = min(len(events), i + rng.randint(1, 60))
        while j < len(events) and events[j][ARRIVAL] == events[j - 1][ARRIVAL]:
            j += 1
        chunk = events[i:j]
        raws = [{k: v for k, v in e.items() if k != ARRIVAL} for e in chunk]
        store.write(decoder.decode(raws, [e[ARRIVAL] for e in chunk]))
        last = chunk[-1][ARRIVAL]
        nxt = events[j][ARRIVAL] if j < len(events) else last + 2 * view.source.lateness_ms
        for _ in range(reads_per_chunk):
            now = rng.randint(last, max(last, nxt - 1))
            picked = rng.sample(ids, min(3, len(ids)))
            values, _ = reader.read(picked, now, dtype=np.float64)
            reads.extend((eid, now, row) for eid, row in zip(picked, values, strict=True))
        i = j
    return reads


def compare(defs: FeatureDefinitions, view: FeatureView, events: pd.DataFrame,
            reads: Sequence[tuple[str, int, Any]], refs: Sequence[str] | None = None
            ) -> VerifyReport:
    """Offline values at each read's (entity, time) against the read's values."""
    refs = list(refs) if refs is not None else [view.ref(f) for f in view.feature_names]
    labels = pd.DataFrame({view.entity.join_key: [r[0] for r in reads],
                           "ts": [int(r[1]) for r in reads]})
    offline = build_training_set(defs, events, labels, refs)
    kinds = {view.ref(o.name): o.kind for o in view.layout().outputs}
    report = VerifyReport(rows=len(reads))
    for j, ref in enumerate(refs):
        col = offline[ref].to_numpy()
        for i, r in enumerate(reads):
            a, b = float(r[2][j]), float(col[i])
            report.values += 1
            if (a == b) if kinds.get(ref) in ("count",) else isclose(a, b):
                continue
            report.mismatches[ref] = report.mismatches.get(ref, 0) + 1
            if len(report.examples) < 10:
                report.examples.append({"feature": ref, "entity": r[0], "ts": int(r[1]),
                                        "online": a, "offline": b})
    return report


def verify_store(store: Any, defs: FeatureDefinitions, *, events_per_view: int = 1500,
                 seed: int = 0, start_ms: int = 1_767_225_600_000,
                 id_prefix: str | None = None) -> dict[str, VerifyReport]:
    """Random-stream skew check of every view against ``store``. Entity ids start with
    ``id_prefix`` (default: ``__redline_verify__`` and a fresh random token per run), so a shared
    store's real entities are never touched and a second run never meets the first run's keys
    (they expire)."""
    if id_prefix is None:
        id_prefix = f"__redline_verify__{secrets.token_hex(6)}_"
    reports = {}
    for name, view in sorted(defs.views.items()):
        events = random_events(view.source, events_per_view, seed, start_ms, id_prefix=id_prefix)
        reads = replay_and_read(store, defs, view, events, seed)
        reports[name] = compare(defs, view, pd.DataFrame(events), reads)
    return reports


def verify_served(defs: FeatureDefinitions, events: pd.DataFrame | EventLog,
                  served: pd.DataFrame) -> VerifyReport:
    """``served`` rows: entity id column(s), ``ts`` (ms) and one column per ``view:feature``
    served; each is recomputed offline from ``events`` and compared."""
    refs = [c for c in served.columns if ":" in str(c)]
    if not refs or "ts" not in served.columns:
        raise InvalidInput("the served log needs a 'ts' column and 'view:feature' columns")
    report = VerifyReport(rows=len(served))
    offline = build_training_set(defs, events, served.drop(columns=refs), refs)
    for ref in refs:
        view, idx = defs.resolve(ref)
        kind = view.layout().outputs[idx].kind
        got = served[ref].to_numpy(dtype=np.float64)
        want = offline[ref].to_numpy(dtype=np.float64)
        for i in range(len(served)):
            a, b = float(got[i]), float(want[i])
            report.values += 1
            # served values are float32 on the wire: compare at float32 precision
            b32 = float(np.float32(b))
            if (a == b) if kind == "count" else (isclose(a, b) or isclose(a, b32, rel=1e-6)):
                continue
            report.mismatches[ref] = report.mismatches.get(ref, 0) + 1
            if len(report.examples) < 10:
                report.examples.append({"feature": ref, "row": i, "served": a, "offline": b})
    return report
