"""Python models (``model.py`` sources) for the tests: good ones, and each way one can be bad."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

HEADER = '''
import os
import time

import numpy as np


'''

# OUTPUT0 = row sums of a [n, 16] FP32 input. With REDLINE_TEST_COUNT_DIR set, each predict
# call appends its row count to <dir>/<model>-<version>.txt, so a test sees how requests were
# batched, whichever process the model runs in.
_ROW_SUM = '''
class Model:
    inputs = {"INPUT0": ("FP32", [-1, 16])}
    outputs = {"OUTPUT0": ("FP32", [-1])}

    def load(self, folder):
        counts = os.environ.get("REDLINE_TEST_COUNT_DIR")
        self.count = f"{counts}/{folder.parent.name}-{folder.name}.txt" if counts else None

    def predict(self, inputs):
        x = inputs["INPUT0"]
        if self.count:
            with open(self.count, "a") as f:
                f.write(f"{len(x)}\\n")
        time.sleep(SLEEP_S)
        return {"OUTPUT0": x.sum(axis=1) * FACTOR}
'''


def row_sum(sleep_s: float = 0.0, factor: float = 1.0) -> str:
    """``ROW_SUM``, each call taking ``sleep_s`` and answering ``factor`` times the sums."""
    return f"SLEEP_S = {sleep_s!r}\nFACTOR = np.float32({factor!r})\n" + _ROW_SUM


ROW_SUM = row_sum()


def counted(count_dir: Path, model: str, version: int = 1) -> list[int]:
    """The row counts of the predict calls of a model version so far."""
    path = count_dir / f"{model}-{version}.txt"
    return [int(n) for n in path.read_text().split()] if path.is_file() else []


# Rows whose first value is 13 make predict raise; 7 gives NaN; 99 sleeps (a hang); -5 exits
# the process (a crash); the rest are row sums.
MOODY = '''
class Model:
    inputs = {"INPUT0": ("FP32", [-1, 16])}
    outputs = {"OUTPUT0": ("FP32", [-1])}

    def predict(self, inputs):
        x = inputs["INPUT0"]
        first = x[:, 0]
        if (first == 13).any():
            raise ValueError(f"unlucky row {int(np.argmax(first == 13))}")
        if (first == 99).any():
            time.sleep(float(os.environ.get("REDLINE_TEST_HANG_S", "30")))
        if (first == -5).any():
            os._exit(3)
        out = x.sum(axis=1)
        out[first == 7] = np.nan
        return {"OUTPUT0": out}
'''


def body(kind: str) -> str:
    """A model.py whose predict is ``kind``: one line that makes its answer."""
    return f'''
class Model:
    inputs = {{"INPUT0": ("FP32", [-1, 16])}}
    outputs = {{"OUTPUT0": ("FP32", [-1])}}

    def predict(self, inputs):
        x = inputs["INPUT0"]
        return {kind}
'''


WRONG_DTYPE = body('{"OUTPUT0": x.sum(axis=1).astype(np.float64)}')
WRONG_SHAPE = body('{"OUTPUT0": x[:, :2].sum(axis=1)[:1]}')
NAN = body('{"OUTPUT0": x.sum(axis=1) * np.nan}')
MISSING = body('{"OUT": x.sum(axis=1)}')
NOT_A_DICT = body("x.sum(axis=1)")
HANGS = body("time.sleep(3600)")
BATCH_DEPENDENT = body('{"OUTPUT0": x.sum(axis=1) - x.sum(axis=1).mean()}')
SYNTAX_ERROR = '''
class Model:
    inputs = {"INPUT0": ("FP32", [-1, 16])}
    outputs = {"OUTPUT0": ("FP32", [-1])}

    def predict(self, inputs)
        return inputs
'''
IMPORT_ERROR = '''
import redline_no_such_package


class Model:
    def predict(self, inputs):
        return inputs
'''
NO_SIGNATURE = '''
class Model:
    def predict(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"].sum(axis=1)}
'''

# A folder model: weights read in load(folder), a helper module imported relatively.
FOLDER_MODEL = '''
from . import scaling


class Scorer:
    inputs = {"x": ("float32", [None, 3]), "tag": ("BYTES", [-1])}
    outputs = {"score": ("FP32", [-1]), "label": ("BYTES", [-1])}

    def load(self, folder):
        self.weights = np.load(folder / "weights.npy")

    def predict(self, inputs):
        score = scaling.scale(inputs["x"] @ self.weights)
        label = np.array([f"{t}:{s:.1f}" for t, s in zip(inputs["tag"], score)], dtype=object)
        return {"score": score.astype(np.float32), "label": label}
'''
SCALING = '''
def scale(v):
    return v * 2
'''


def write(folder: Path, source: str, name: str = "model.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(HEADER + textwrap.dedent(source).lstrip())
    return path


def folder_model(folder: Path) -> Path:
    write(folder, FOLDER_MODEL)
    (folder / "scaling.py").write_text(SCALING)
    np.save(folder / "weights.npy", np.array([1.0, 2.0, 3.0], np.float32))
    return folder


def rows(n: int = 8, first: float | None = None, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).random((n, 16), dtype=np.float32)
    if first is not None:
        x[:, 0] = first
    return x
