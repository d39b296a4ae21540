"""Train the recommender: item embeddings, a LightGBM ranker, offline metrics, artifacts.

Every click of a session after its first event is a request: "given this session so far (and
this user), which item comes next?". Sessions that start in the last ``holdout_days`` are held
out. Requests see features as of 1 ms before the click (``redline.features.offline``: the same
arithmetic as the online stores) and the session's items before it (what the session state
holds). The embeddings learn on the earlier part of the training period, the ranker on the
later part (so it learns from retrieval scores of requests the embeddings did not fit), and both
are scored on the held-out sessions against a popularity baseline.

    python train.py --data data --out artifacts
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import embeddings  # noqa: E402
import ranking  # noqa: E402
from features import events_of  # noqa: E402
from metrics import recall_ndcg  # noqa: E402
from ranking import USER_FEATURES  # noqa: E402

DAY_MS = 24 * 3_600_000
K = 100  # candidates retrieved per request


@dataclass
class Requests:
    """Requests in columns: who, when, the session before the click, and the clicked item."""

    user_id: list[str]
    ts: np.ndarray  # the click's time (features are read 1 ms before it)
    session: list[list[int]]  # item indices before the click, most recent first
    target: np.ndarray
    session_start: np.ndarray

    def take(self, mask: np.ndarray) -> Requests:
        idx = np.flatnonzero(mask)
        return Requests([self.user_id[i] for i in idx], self.ts[idx],
                        [self.session[i] for i in idx], self.target[idx],
                        self.session_start[idx])

    def padded(self, n_items: int) -> np.ndarray:
        out = np.full((len(self.ts), embeddings.SESSION_ITEMS), n_items, dtype=np.int64)
        for row, items in enumerate(self.session):
            kept = items[: embeddings.SESSION_ITEMS]
            out[row, : len(kept)] = kept
        return out


def requests_of(events: list[dict], index: dict[str, int]) -> Requests:
    sessions: dict[str, list[dict]] = {}
    for e in events:
        sessions.setdefault(e["session_id"], []).append(e)
    users, ts, before, target, start = [], [], [], [], []
    for evs in sessions.values():
        seen: list[int] = []
        for e in evs:
            item = index[e["item_id"]]
            if e["type"] == "click" and seen and item not in seen:
                users.append(e["user_id"])
                ts.append(e["ts"])
                before.append(seen[::-1][: embeddings.SESSION_ITEMS])
                target.append(item)
                start.append(evs[0]["ts"])
            seen.append(item)
    order = np.argsort(ts, kind="stable")
    return Requests([users[i] for i in order], np.asarray(ts)[order],
                    [before[i] for i in order], np.asarray(target)[order],
                    np.asarray(start)[order])


def windows(defs: object, events: pd.DataFrame, key: str, ids: list[str], ts: np.ndarray,
            refs: list[str]) -> np.ndarray:
    """Point-in-time feature values of ``ids`` as of ``ts - 1`` ([n, len(refs)] float32)."""
    from redline.features.offline import build_training_set

    rows = pd.DataFrame({key: ids, "ts": ts - 1})
    table = build_training_set(defs, events, rows, refs)  # type: ignore[arg-type]
    return table[refs].to_numpy(dtype=np.float32)


def popularity_ranking(train_events: list[dict], index: dict[str, int], n_items: int,
                       sessions: list[list[int]], k: int) -> np.ndarray:
    """The baseline: the most clicked items of the training period, minus the session's own."""
    clicks = np.zeros(n_items)
    for e in train_events:
        if e["type"] == "click":
            clicks[index[e["item_id"]]] += 1
    top = np.argsort(-clicks, kind="stable")[: k + embeddings.SESSION_ITEMS]
    return np.array([[i for i in top if i not in set(s)][:k] for s in sessions])


def train(data: object, out: str | Path, *, holdout_days: float = 1.0, rank_share: float = 0.3,
          epochs: int = 3, trees: int = 100, max_rank_requests: int = 3000,
          max_eval_requests: int = 3000, candidates: int = K, seed: int = 0,
          log=print) -> dict:  # noqa: ANN001
    """Train both stages, evaluate, write ``items.npy``, ``items.parquet``, ``graph.yaml``,
    ``ranker.onnx`` and ``metrics.json`` into ``out``; returns the metrics."""
    from redline.features import load_definitions

    k = candidates
    t0 = time.perf_counter()
    defs = load_definitions(HERE / "features.py")
    items = data.items  # type: ignore[attr-defined]
    events = data.events  # type: ignore[attr-defined]
    index = {it["item_id"]: i for i, it in enumerate(items)}
    n_items = len(items)
    category = np.array([int(it["category"][3:]) for it in items])
    price = np.array([it["price"] for it in items], dtype=np.float64)
    popularity = np.array([it["popularity"] for it in items], dtype=np.float64)
    feature_events = pd.DataFrame([f for e in events for f in events_of(e)])
    user_events = feature_events[feature_events["source"] == "user_events"].dropna(axis=1)

    reqs = requests_of(events, index)
    split = data.end_ms - int(holdout_days * DAY_MS)  # type: ignore[attr-defined]
    fit_all = reqs.take(reqs.session_start < split)
    held = reqs.take(reqs.session_start >= split)
    rng = np.random.default_rng(seed)
    if len(held.ts) > max_eval_requests:
        held = held.take(np.isin(np.arange(len(held.ts)),
                                 rng.choice(len(held.ts), max_eval_requests, replace=False)))
    cut = np.quantile(fit_all.ts, 1.0 - rank_share)
    tower_reqs, rank_reqs = fit_all.take(fit_all.ts < cut), fit_all.take(fit_all.ts >= cut)
    if len(rank_reqs.ts) > max_rank_requests:
        rank_reqs = rank_reqs.take(np.isin(np.arange(len(rank_reqs.ts)), rng.choice(
            len(rank_reqs.ts), max_rank_requests, replace=False)))

    def user_fields(r: Requests) -> np.ndarray:
        return windows(defs, user_events, "user_id", r.user_id, r.ts, USER_FEATURES)

    item_matrix = embeddings.train(tower_reqs.padded(n_items), tower_reqs.target, category,
                                   epochs=epochs, seed=seed)
    log(f"item embeddings: {len(tower_reqs.ts)} requests, {time.perf_counter() - t0:.1f} s")
    item_columns = np.column_stack([price, np.log(popularity), category]).astype(np.float32)

    def retrieve(r: Requests) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cands, scores = embeddings.top_k(embeddings.queries(item_matrix, r.session),
                                         item_matrix, k)
        uf = user_fields(r)
        x = np.stack([ranking.candidate_features(cands[n], scores[n], len(r.session[n]),
                                                 item_columns, uf[n])
                      for n in range(len(r.ts))])
        return cands, scores, x

    def final(r: Requests, ordered: np.ndarray) -> np.ndarray:
        """The rules step: drop what the session saw, keep the top 10."""
        return np.array([[i for i in row if i not in set(s)][:10] + [-1] * 10
                         for row, s in zip(ordered.tolist(), r.session, strict=True)])[:, :10]

    cands, _, x = retrieve(rank_reqs)
    y = (cands == rank_reqs.target[:, None]).astype(int)
    useful = y.any(axis=1)
    ranker = ranking.train_ranker(x[useful].reshape(-1, x.shape[2]), y[useful].reshape(-1),
                                  [k] * int(useful.sum()), trees=trees, seed=seed)
    ranker_onnx = ranking.to_onnx(ranker, x.shape[2])
    log(f"ranker: {int(useful.sum())} requests x {k} candidates, "
        f"{time.perf_counter() - t0:.1f} s")

    cands, _, xh = retrieve(held)
    ranked_scores = ranker.predict(xh.reshape(-1, xh.shape[2])).reshape(len(held.ts), k)
    reranked = np.take_along_axis(cands, np.argsort(-ranked_scores, axis=1, kind="stable"), 1)
    popular = popularity_ranking([e for e in events if e["ts"] < split], index, n_items,
                                 held.session, 10)
    result = {"holdout_requests": len(held.ts), "train_requests": len(tower_reqs.ts),
              "rank_requests": int(useful.sum()), "candidates": k}
    for name, ranked in (("popularity", popular), ("retrieval", final(held, cands)),
                         ("ranked", final(held, reranked))):
        recall, ndcg = recall_ndcg(ranked, held.target, 10)
        result[f"{name}_recall_at_10"], result[f"{name}_ndcg_at_10"] = recall, ndcg
    result["retrieval_recall_at_k"] = recall_ndcg(cands, held.target, k)[0]
    catalogue = pd.DataFrame({"item_id": [it["item_id"] for it in items],
                              "price": price.astype(np.float32),
                              "log_popularity": item_columns[:, 1],
                              "category_code": item_columns[:, 2],
                              "popularity": popularity.astype(np.float32)})
    write_artifacts(Path(out), catalogue, item_matrix, ranker_onnx, result, k)
    result["seconds"] = time.perf_counter() - t0
    return result


def graph_yaml(k: int) -> str:
    """The inference graph that serves these artifacts (``docs/recommend.md``)."""
    entity = ", ".join(USER_FEATURES)
    features = "".join(f"\n        - {f}" for f in ranking.RANK_FEATURES)
    return (f"# The recommender: session items -> query -> top-{k} -> LightGBM ranker -> rules\n"
            f"steps:\n"
            f"  - features: {{session_items: {embeddings.SESSION_ITEMS}, entity: [{entity}]}}\n"
            f"  - retrieve: {{k: {k}}}\n"
            f"  - rank:\n      model: ranker.onnx\n      features:{features}\n"
            f"  - rules: {{drop_seen: true}}\n"
            f"output: {{top_n: 10}}\n")


def write_artifacts(out: Path, catalogue: pd.DataFrame, item_matrix: np.ndarray,
                    ranker_onnx: bytes, result: dict, k: int) -> None:
    """A model version folder for ``redline models add`` plus ``metrics.json``."""
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "items.npy", item_matrix)
    catalogue.to_parquet(out / "items.parquet", index=False)
    (out / "ranker.onnx").write_bytes(ranker_onnx)
    (out / "graph.yaml").write_text(graph_yaml(k))
    (out / "metrics.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


def main() -> None:
    from generate import generate, read

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None,
                        help="a folder generate.py wrote (default: generate in memory)")
    parser.add_argument("--out", default="artifacts")
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=4000)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    embeddings.require_torch()  # one line with the install command, before minutes of work
    data = read(Path(args.data)) if args.data else generate(args.items, args.users, args.days,
                                                            args.seed)
    r = train(data, args.out)
    print(f"held-out next click, {r['holdout_requests']} requests: recall@10 / NDCG@10 "
          f"popularity {r['popularity_recall_at_10']:.3f} / {r['popularity_ndcg_at_10']:.3f}, "
          f"retrieval {r['retrieval_recall_at_10']:.3f} / {r['retrieval_ndcg_at_10']:.3f}, "
          f"retrieval + ranker {r['ranked_recall_at_10']:.3f} / {r['ranked_ndcg_at_10']:.3f} "
          f"(recall@{K} of retrieval {r['retrieval_recall_at_k']:.3f}); "
          f"artifacts in {args.out}/")


if __name__ == "__main__":
    main()
