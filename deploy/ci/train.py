"""Train a digits MLP and register it: the "training job" of the example CI workflow.

Replace this with your own training; what the workflow needs is a registered model version,
validation rows (val.npz) and tuning rows (train.npz).

    python deploy/ci/train.py --repository .redline/models --data-dir ci-data [--promote]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repository", default=".redline/models")
    parser.add_argument("--data-dir", default="ci-data")
    parser.add_argument("--model", default="digits")
    parser.add_argument("--hidden", default="256,128", help="hidden layer sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--promote", action="store_true", help="make it the production version")
    args = parser.parse_args()

    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    from redline.models import ModelRepository

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))  # fixed split across runs
    x, y = x[order], y[order]
    x_train, y_train, x_val, y_val = x[:1200], y[:1200], x[1200:], y[1200:]
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    np.savez(data / "train.npz", X=x_train, y=y_train)
    np.savez(data / "val.npz", X=x_val, y=y_val)

    hidden = tuple(int(h) for h in args.hidden.split(","))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MLPClassifier(hidden, max_iter=60, random_state=args.seed).fit(x_train, y_train)
    repo = ModelRepository(args.repository)
    meta = repo.add_estimator(args.model, model, x_train[:256],
                              metrics={"accuracy": float(model.score(x_val, y_val))})
    if args.promote:
        repo.promote(args.model, meta.version)
    print(f"registered {args.model} version {meta.version} "
          f"(validation accuracy {meta.metrics['accuracy']:.4f})")


if __name__ == "__main__":
    main()
