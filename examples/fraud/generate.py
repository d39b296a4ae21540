"""A seeded generator of card transactions with realistic fraud, as an event and a label stream.

Legitimate life: every card belongs to a user with a handful of usual merchants, a typical
amount (log-normal around a per-user median) and a daily rhythm (mostly 7:00-23:00). Fraud comes
in the shapes investigators know:

* **stolen card** — a burst of 2-4 small "test" charges within a couple of minutes, then 2-5
  large charges at electronics, jewellery or gift-card merchants within half an hour, often at
  night, at merchants the card never used;
* **card testing** — one compromised merchant sees dozens of different cards make tiny charges
  within a few minutes.

Labels arrive late, as they do in real life (chargebacks): a fraud label 12-72 hours after the
transaction, a "genuine" one 72 hours after. Labels not yet known at the end of the period are
not in the label stream.

    python generate.py --out data --cards 2000 --days 8 --seed 7
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
CATEGORIES = ["grocery", "restaurant", "fuel", "pharmacy", "clothing", "travel", "online",
              "electronics", "jewelry", "gift_cards"]
RISKY = ["electronics", "jewelry", "gift_cards"]
# Share of legitimate spending per hour of day (a daily rhythm with a quiet night).
HOURLY = np.array([0.3, 0.2, 0.1, 0.1, 0.1, 0.2, 0.6, 1.5, 2.5, 3.0, 3.2, 3.5,
                   4.0, 3.6, 3.2, 3.2, 3.5, 4.0, 4.4, 4.0, 3.2, 2.4, 1.4, 0.7])
HOURLY = HOURLY / HOURLY.sum()


@dataclass
class Dataset:
    transactions: list[dict]  # time-ordered; "is_fraud" is the ground truth (not an event field)
    labels: list[dict]  # time-ordered by label arrival
    start_ms: int
    end_ms: int


def generate(cards: int = 2000, days: float = 8, seed: int = 7, end_ms: int | None = None,
             merchants: int | None = None, txn_per_day: float = 2.0,
             stolen_share: float = 0.03, card_testing_attacks: int | None = None,
             recent_bursts: int = 3) -> Dataset:
    """Transactions in ``[end_ms - days, end_ms)`` and the labels known by ``end_ms``."""
    rng = np.random.default_rng(seed)
    end = int(end_ms if end_ms is not None else time.time() * 1000)
    start = end - int(days * DAY_MS)
    n_merchants = merchants or max(50, cards // 10)
    m_cat = rng.choice(len(CATEGORIES), n_merchants,
                       p=[0.22, 0.2, 0.12, 0.08, 0.1, 0.04, 0.12, 0.06, 0.03, 0.03])
    risky_merchants = np.flatnonzero(np.isin(m_cat, [CATEGORIES.index(c) for c in RISKY]))
    txns: list[dict] = []

    def add(card: int, merchant: int, amount: float, ts: int, fraud: int, kind: str) -> None:
        txns.append({"card_id": f"c{card}", "merchant_id": f"m{merchant}",
                     "category": CATEGORIES[m_cat[merchant]], "amount": round(float(amount), 2),
                     "ts": int(ts), "is_fraud": fraud, "kind": kind})

    # Legitimate spending.
    for card in range(cards):
        usual = rng.choice(n_merchants, rng.integers(3, 10), replace=False)
        median = float(rng.lognormal(3.4, 0.6))  # ~ 30 with a wide spread across users
        rate = txn_per_day * rng.lognormal(0, 0.5)
        n = rng.poisson(rate * days)
        day = rng.integers(0, int(np.ceil(days)), n)
        hour = rng.choice(24, n, p=HOURLY)
        offset = day * DAY_MS + hour * HOUR_MS + rng.integers(0, HOUR_MS, n)
        ok = offset < days * DAY_MS
        for off in offset[ok]:
            if rng.random() < 0.03:  # a genuine splurge: big, at a risky merchant, any hour
                add(card, int(rng.choice(risky_merchants)), rng.lognormal(5.3, 0.7),
                    start + int(off), 0, "genuine")
                continue
            merchant = int(rng.choice(usual)) if rng.random() < 0.85 else int(
                rng.integers(n_merchants))
            add(card, merchant, median * rng.lognormal(0, 0.6), start + int(off), 0, "genuine")
    # Stolen cards: test charges, then large ones at risky merchants, often at night. The last
    # few are in the final hours, so a replay of the most recent transactions meets fraud.
    stolen = rng.choice(cards, int(cards * stolen_share), replace=False)
    recent = set(stolen[:recent_bursts].tolist())
    for card in stolen:
        t0 = start + int(rng.uniform(0.5, days) * DAY_MS) - 3 * HOUR_MS
        if rng.random() < 0.6:  # at night
            t0 = (t0 // DAY_MS) * DAY_MS + int(rng.uniform(0, 5) * HOUR_MS)
        if card in recent:
            t0 = end - int(rng.uniform(1.5, 5) * HOUR_MS)
        t0 = max(t0, start)
        ts = t0
        for _ in range(rng.integers(2, 5)):
            ts += int(rng.uniform(5, 40) * 1000)
            ts += int(rng.uniform(0, 20) * 60_000) if rng.random() < 0.3 else 0
            add(card, int(rng.integers(n_merchants)), rng.uniform(0.5, 15), ts, 1, "test_charge")
        for _ in range(rng.integers(1, 5)):
            ts += int(rng.uniform(1, 45) * 60_000)
            where = rng.choice(risky_merchants) if rng.random() < 0.7 else rng.integers(
                n_merchants)
            add(card, int(where), rng.lognormal(5.0, 0.9), ts, 1, "cash_out")
    # Card testing: many cards, tiny charges, one merchant, a few minutes.
    attacks = card_testing_attacks if card_testing_attacks is not None else max(1, int(days // 2))
    for _ in range(attacks):
        merchant = int(rng.integers(n_merchants))
        t0 = start + int(rng.uniform(1, days) * DAY_MS) - HOUR_MS
        for card in rng.choice(cards, min(cards, int(rng.integers(20, 60))), replace=False):
            add(int(card), merchant, rng.uniform(0.5, 2), t0 + int(rng.uniform(0, 300_000)), 1,
                "card_testing")
    txns = [t for t in txns if start <= t["ts"] < end]
    txns.sort(key=lambda t: t["ts"])
    for i, t in enumerate(txns):
        t["txn_id"] = f"t{i}"
    labels = []
    for t in txns:
        delay = rng.uniform(12, 72) * HOUR_MS if t["is_fraud"] else 72 * HOUR_MS
        label_ts = t["ts"] + int(delay)
        if label_ts < end:
            labels.append({"txn_id": t["txn_id"], "card_id": t["card_id"],
                           "merchant_id": t["merchant_id"], "is_fraud": float(t["is_fraud"]),
                           "ts": label_ts})
    labels.sort(key=lambda r: r["ts"])
    return Dataset(txns, labels, start, end)


def transaction_event(t: dict) -> dict:
    """What the card network sends us: the transaction without its (unknown) truth."""
    return {"txn_id": t["txn_id"], "card_id": t["card_id"], "merchant_id": t["merchant_id"],
            "category": t["category"], "amount": t["amount"], "ts": t["ts"]}


def write(data: Dataset, out: Path) -> None:
    """``transactions.jsonl`` (the event stream), ``labels.jsonl`` (delayed labels),
    ``truth.jsonl`` (every transaction's ground truth, for evaluation only) and
    ``events.jsonl`` (both as feature events, source-tagged, for ``redline ingest file``)."""
    from features import events_of, label_event

    out.mkdir(parents=True, exist_ok=True)
    (out / "period.json").write_bytes(orjson.dumps({"start_ms": data.start_ms,
                                                    "end_ms": data.end_ms}))
    events = [e for t in data.transactions for e in events_of(t)]
    events += [label_event(r) for r in data.labels]
    events.sort(key=lambda e: e["ts"])
    with open(out / "events.jsonl", "wb") as f:
        for e in events:
            f.write(orjson.dumps(e) + b"\n")
    with open(out / "transactions.jsonl", "wb") as f:
        for t in data.transactions:
            f.write(orjson.dumps(transaction_event(t)) + b"\n")
    with open(out / "labels.jsonl", "wb") as f:
        for r in data.labels:
            f.write(orjson.dumps(r) + b"\n")
    with open(out / "truth.jsonl", "wb") as f:
        for t in data.transactions:
            f.write(orjson.dumps({"txn_id": t["txn_id"], "is_fraud": t["is_fraud"],
                                  "kind": t["kind"]}) + b"\n")


def read(folder: Path) -> Dataset:
    """A dataset ``write`` left in ``folder`` (transactions with their truth, and labels)."""
    truth = {r["txn_id"]: r for r in map(orjson.loads, (folder / "truth.jsonl").read_bytes()
                                         .splitlines())}
    txns = [{**t, "is_fraud": truth[t["txn_id"]]["is_fraud"], "kind": truth[t["txn_id"]]["kind"]}
            for t in map(orjson.loads, (folder / "transactions.jsonl").read_bytes().splitlines())]
    labels = [orjson.loads(line) for line in (folder / "labels.jsonl").read_bytes().splitlines()]
    meta = orjson.loads((folder / "period.json").read_bytes())
    return Dataset(txns, labels, meta["start_ms"], meta["end_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data")
    parser.add_argument("--cards", type=int, default=2000)
    parser.add_argument("--days", type=float, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    data = generate(args.cards, args.days, args.seed)
    write(data, Path(args.out))
    fraud = sum(t["is_fraud"] for t in data.transactions)
    print(f"{len(data.transactions)} transactions ({fraud} fraudulent), {len(data.labels)} "
          f"labels known by the end, written to {args.out}/")


if __name__ == "__main__":
    main()
