"""The MLServer peer's model folder: the demo forest with MLServer's scikit-learn runtime.

    python model.py FOLDER HTTP_PORT GRPC_PORT METRICS_PORT

Runs in the MLServer peer's environment (``benchmarks/peers/setup.sh mlserver``), so the pickle
is written by the scikit-learn that loads it. The forest is the one the serving comparison
trains for every server (100 trees, depth 8, breast cancer, one FP32 row of 30 features);
MLServer answers ``predict_proba`` for input ``input-0``. Serve it with ``mlserver start
FOLDER``.
"""

import json
import sys
from pathlib import Path

import joblib
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.ensemble import RandomForestClassifier

folder = Path(sys.argv[1])
http_port, grpc_port, metrics_port = (int(p) for p in sys.argv[2:5])
x, y = load_breast_cancer(return_X_y=True)
forest = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0)
forest.fit(x.astype(np.float32), y)
(folder / "rf").mkdir(parents=True, exist_ok=True)
joblib.dump(forest, folder / "rf" / "model.joblib")
(folder / "settings.json").write_text(json.dumps({
    "debug": False, "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
    "metrics_port": metrics_port}, indent=2))
(folder / "rf" / "model-settings.json").write_text(json.dumps({
    "name": "rf", "implementation": "mlserver_sklearn.SKLearnModel",
    "parameters": {"uri": "./model.joblib", "version": "v1",
                   "extra": {"predict_fn": "predict_proba"}},
    "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, 30]}],
    "outputs": [{"name": "predict_proba", "datatype": "FP64", "shape": [-1, 2]}]}, indent=2))
