"""A seeded shop: a catalogue with hidden structure, users with hidden tastes, and their sessions.

The catalogue (default 50,000 items) has categories, each split into styles; every item has a
price (log-normal around its category's level), a popularity (Zipf) and a hidden taste vector
near its style's. Every user likes two or three styles. A session has one intent (mostly one of
the user's styles) and is a run of clicks, some followed by an add-to-cart, each click drawn
within the intent's category with odds ``popularity^a * exp(b * taste . item)``. So the next
click is predictable from what the session clicked before (and the user), which popularity alone
does not see: learning pays.

    python generate.py --out data --items 50000 --users 4000 --days 7 --seed 7

Writes ``items.jsonl`` (the catalogue) and ``events.jsonl`` (time-ordered session events).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
TASTE_DIM = 16
EVENT_TYPES = ("click", "add_to_cart")


@dataclass
class Dataset:
    items: list[dict]  # item_id, category, price, popularity (row i is item index i)
    events: list[dict]  # time-ordered: user_id, session_id, item_id, type, ts
    start_ms: int
    end_ms: int

    @property
    def item_index(self) -> dict[str, int]:
        return {it["item_id"]: i for i, it in enumerate(self.items)}


def catalogue(rng: np.random.Generator, n_items: int, n_categories: int,
              styles_per_category: int) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
    """Items plus their hidden taste vectors, style ids and category ids."""
    cat_centre = rng.normal(size=(n_categories, TASTE_DIM))
    style_centre = rng.normal(size=(n_categories, styles_per_category, TASTE_DIM))
    category = rng.integers(0, n_categories, n_items)
    style = rng.integers(0, styles_per_category, n_items)
    taste = (cat_centre[category] + 0.9 * style_centre[category, style]
             + 0.35 * rng.normal(size=(n_items, TASTE_DIM)))
    taste /= np.linalg.norm(taste, axis=1, keepdims=True)
    popularity = 1.0 / (1.0 + rng.permutation(n_items)) ** 0.9
    popularity /= popularity.max()
    price_level = rng.lognormal(3.0, 0.8, n_categories)
    price = price_level[category] * rng.lognormal(0.0, 0.4, n_items)
    items = [{"item_id": f"i{i}", "category": f"cat{category[i]}",
              "price": round(float(price[i]), 2), "popularity": round(float(popularity[i]), 6)}
             for i in range(n_items)]
    return items, taste, category * styles_per_category + style, category


def generate(items: int = 50_000, users: int = 4000, days: float = 7, seed: int = 7,
             end_ms: int | None = None, sessions_per_user: float = 3.0, categories: int = 24,
             styles_per_category: int = 8) -> Dataset:
    """A catalogue and the session events in ``[end_ms - days, end_ms)``."""
    rng = np.random.default_rng(seed)
    end = int(end_ms if end_ms is not None else time.time() * 1000)
    start = end - int(days * DAY_MS)
    catalog, taste, style_of, category_of = catalogue(rng, items, categories,
                                                      styles_per_category)
    pop = np.array([it["popularity"] for it in catalog])
    by_category = [np.flatnonzero(category_of == c) for c in range(categories)]
    n_styles = categories * styles_per_category
    style_taste = np.zeros((n_styles, TASTE_DIM))
    np.add.at(style_taste, style_of, taste)
    style_taste /= np.maximum(np.linalg.norm(style_taste, axis=1, keepdims=True), 1e-9)
    events: list[dict] = []
    session_no = 0
    for user in range(users):
        liked = rng.choice(n_styles, rng.integers(2, 4), replace=False)
        user_taste = style_taste[liked].mean(axis=0) + 0.3 * rng.normal(size=TASTE_DIM)
        for _ in range(max(1, rng.poisson(sessions_per_user))):
            intent = rng.choice(liked) if rng.random() < 0.85 else rng.integers(n_styles)
            pool = by_category[intent // styles_per_category]
            want = style_taste[intent] + 0.5 * user_taste
            logits = 0.5 * np.log(pop[pool]) + 11.0 * (taste[pool] @ want)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            clicks = rng.choice(pool, min(len(pool), 2 + rng.geometric(0.18)), replace=False, p=p)
            t = start + int(rng.uniform(0, days * DAY_MS - HOUR_MS))
            sid = f"s{session_no}"
            session_no += 1
            for item in clicks:
                t += int(rng.exponential(25_000)) + 1000
                events.append({"user_id": f"u{user}", "session_id": sid,
                               "item_id": f"i{item}", "type": "click", "ts": t})
                if rng.random() < 0.15 + 0.3 * float(taste[item] @ want > 1.0):
                    t += int(rng.exponential(8000)) + 500
                    events.append({"user_id": f"u{user}", "session_id": sid,
                                   "item_id": f"i{item}", "type": "add_to_cart", "ts": t})
    events = [e for e in events if e["ts"] < end]
    events.sort(key=lambda e: e["ts"])
    return Dataset(catalog, events, start, end)


def write(data: Dataset, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "items.jsonl").write_bytes(b"\n".join(orjson.dumps(i) for i in data.items) + b"\n")
    (out / "events.jsonl").write_bytes(b"\n".join(orjson.dumps(e) for e in data.events) + b"\n")
    (out / "period.json").write_bytes(orjson.dumps({"start_ms": data.start_ms,
                                                    "end_ms": data.end_ms}))


def read(folder: Path) -> Dataset:
    def lines(name: str) -> list[dict]:
        return [orjson.loads(x) for x in (folder / name).read_bytes().splitlines() if x]

    period = orjson.loads((folder / "period.json").read_bytes())
    return Dataset(lines("items.jsonl"), lines("events.jsonl"), period["start_ms"],
                   period["end_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data")
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=4000)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    data = generate(args.items, args.users, args.days, args.seed)
    write(data, Path(args.out))
    sessions = len({e["session_id"] for e in data.events})
    print(f"{len(data.items)} items, {len(data.events)} events in {sessions} sessions -> "
          f"{args.out}/")


if __name__ == "__main__":
    main()
