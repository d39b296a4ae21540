"""Train a digits MLP and register it: the "training job" of the example CI workflow.

Replace this with your own training. What the workflow needs from it: a registered model
version and three disjoint row sets, cut the same way on every branch (a fixed shuffle):

- ``train.npz``: what the model is trained on; ``redline optimize`` also fits on it
  (calibration, fine-tuning, distillation) through ``--train-data``;
- ``val.npz``: ``redline optimize --data``: the rows it chooses a candidate on and reports on;
- ``gate.npz``: held out for ``redline gate`` — rows that neither trained the model nor chose
  the optimized candidate, so the gate's verdict is not the optimizer grading itself.

    python deploy/ci/train.py --repository .redline/models --data-dir ci-data [--promote]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

TRAIN_ROWS, VAL_ROWS = 1000, 400  # the rest (397 of 1,797) is the gate's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repository", default=".redline/models")
    parser.add_argument("--data-dir", default="ci-data")
    parser.add_argument("--model", default="digits")
    parser.add_argument("--hidden", default="256,128", help="hidden layer sizes")
    parser.add_argument("--max-iter", type=int, default=60, help="training epochs")
    parser.add_argument("--seed", type=int, default=0, help="training seed (not the split)")
    parser.add_argument("--promote", action="store_true", help="make it the production version")
    args = parser.parse_args()

    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    from redline.models import ModelRepository

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))  # fixed split across runs and branches
    x, y = x[order], y[order]
    cut = TRAIN_ROWS + VAL_ROWS
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    np.savez(data / "train.npz", X=x[:TRAIN_ROWS], y=y[:TRAIN_ROWS])
    np.savez(data / "val.npz", X=x[TRAIN_ROWS:cut], y=y[TRAIN_ROWS:cut])
    np.savez(data / "gate.npz", X=x[cut:], y=y[cut:])

    hidden = tuple(int(h) for h in args.hidden.split(","))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MLPClassifier(hidden, max_iter=args.max_iter, random_state=args.seed).fit(
            x[:TRAIN_ROWS], y[:TRAIN_ROWS])
    repo = ModelRepository(args.repository)
    meta = repo.add_estimator(args.model, model, x[:256],
                              metrics={"accuracy": float(model.score(x[TRAIN_ROWS:cut],
                                                                     y[TRAIN_ROWS:cut]))})
    if args.promote:
        repo.promote(args.model, meta.version)
    print(f"registered {args.model} version {meta.version} "
          f"(validation accuracy {meta.metrics['accuracy']:.4f})")


if __name__ == "__main__":
    main()
