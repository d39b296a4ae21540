"""Point-in-time training set from the event log, a LightGBM model, and its registration.

Every transaction becomes a training row whose features are what the online store would have
answered just before the transaction arrived (``redline.features.offline``: the same tile
arithmetic as the online stores), so training and serving see the same numbers. The model is
registered with the feature-view versions it was trained on; serving it against other versions
is refused.

    python train.py --data data      # registers into the repository redline.yaml names
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from features import MODEL_FEATURES, events_of, hour_of, label_event  # noqa: E402

DAY_MS = 24 * 3_600_000


def event_log(transactions: list[dict], labels: list[dict]) -> pd.DataFrame:
    """Every feature event (transactions by card and by merchant, labels by merchant)."""
    rows = [e for t in transactions for e in events_of(t)] + [label_event(r) for r in labels]
    return pd.DataFrame(rows)


def training_set(defs: object, events: pd.DataFrame, transactions: list[dict]) -> pd.DataFrame:
    """One row per transaction: its features as of 1 ms before it, plus its label."""
    from redline.features.offline import build_training_set

    rows = pd.DataFrame({
        "card_id": [t["card_id"] for t in transactions],
        "merchant_id": [t["merchant_id"] for t in transactions],
        "ts": [t["ts"] - 1 for t in transactions],
        "amount": [t["amount"] for t in transactions],
        "ts_s": [t["ts"] / 1000.0 for t in transactions],
        "hour": [hour_of(t["ts"]) for t in transactions],
        "is_fraud": [t["is_fraud"] for t in transactions],
    })
    online = [f for f in MODEL_FEATURES if f not in rows.columns]  # request fields are columns
    return build_training_set(defs, events, rows, online)  # type: ignore[arg-type]


def train(data: object, repository: str | Path, *, holdout_days: float = 2.0,
          warm_days: float = 1.0, name: str = "fraud", trees: int = 150) -> dict:
    """Train on [start + warm_days, end - holdout_days), evaluate on the held-out end, register.

    The first ``warm_days`` only fill the windows (a 7-day window starts empty).
    """
    import lightgbm as lgb
    from sklearn.metrics import average_precision_score, roc_auc_score

    from redline.features import load_definitions
    from redline.models import ModelRepository

    defs = load_definitions(HERE / "features.py")
    txns = data.transactions  # type: ignore[attr-defined]
    events = event_log(txns, data.labels)  # type: ignore[attr-defined]
    split = data.end_ms - int(holdout_days * DAY_MS)  # type: ignore[attr-defined]
    first = data.start_ms + int(warm_days * DAY_MS)  # type: ignore[attr-defined]
    table = training_set(defs, events, [t for t in txns if t["ts"] >= first])
    x = table[MODEL_FEATURES].to_numpy(dtype=np.float32)
    y = table["is_fraud"].to_numpy()
    ts = table["ts"].to_numpy()
    fit, held = ts < split, ts >= split
    model = lgb.LGBMClassifier(n_estimators=trees, num_leaves=15, learning_rate=0.08,
                               min_child_samples=10, subsample=0.8, subsample_freq=1,
                               colsample_bytree=0.9, random_state=0, verbose=-1)
    model.fit(x[fit], y[fit])
    scores = model.predict_proba(x[held])[:, 1]
    auc = float(roc_auc_score(y[held], scores))
    ap = float(average_precision_score(y[held], scores))
    repo = ModelRepository(repository)
    meta = repo.add_estimator(
        name, model, x[fit][:2000], feature_names=MODEL_FEATURES,
        feature_views={v: defs.views[v].version for v in
                       ("card_activity", "merchant_activity", "merchant_risk")},
        metrics={"roc_auc_holdout": auc, "average_precision_holdout": ap},
        description="fraud example: LightGBM on point-in-time card and merchant features",
    )
    repo.promote(name, meta.version)
    return {"version": meta.version, "roc_auc": auc, "average_precision": ap,
            "train_rows": int(fit.sum()), "holdout_rows": int(held.sum()),
            "holdout_fraud": int(y[held].sum()), "table": table}


def main() -> None:
    from generate import Dataset, generate, read

    from redline.config import load_settings

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", default=None,
                        help="model repository (default: the one redline.yaml here names)")
    parser.add_argument("--data", default=None,
                        help="a folder generate.py wrote (default: generate in memory)")
    parser.add_argument("--cards", type=int, default=2000)
    parser.add_argument("--days", type=float, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    data: Dataset = read(Path(args.data)) if args.data else generate(args.cards, args.days,
                                                                     args.seed)
    repository = args.repository or load_settings(HERE / "redline.yaml", environ={}).repository
    result = train(data, repository)
    print(f"registered fraud version {result['version']} in {repository}: ROC AUC "
          f"{result['roc_auc']:.3f} on "
          f"{result['holdout_rows']} held-out transactions ({result['holdout_fraud']} fraud)")


if __name__ == "__main__":
    main()
