"""Triton's side of the Python-model comparison: a model repository of Python-backend models.

``write_repository(folder, graph_files)`` writes, for Triton's Python backend (its only backend
in the nvidia-pytriton wheel; ``benchmarks/peers/pytriton/serve.py`` serves the folder):

- ``rowsum``: the model that does no work, one request per ``execute`` (no batching:
  ``max_batch_size: 0``), one instance;
- ``rowsum_batched``: the same with Triton's dynamic batcher (``max_batch_size: 64``): each
  ``execute`` gets the queued requests and answers them with one numpy call over their rows
  concatenated, as Triton's Python backend documentation advises;
- ``featurize``, ``mlp`` (the graph's ONNX file through onnxruntime, one thread: the wheel has
  no ONNX Runtime backend), ``post`` and the ensemble ``graph`` that chains them, and
  ``*_batched`` and ``graph_batched``: the same with the dynamic batcher on every step.

Every step is written as Triton's documentation writes a Python model: ``TritonPythonModel``
with ``initialize`` and ``execute``, tensors through ``pb_utils``. The numpy work is
``workload.py``'s, copied beside each model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent

_PRELUDE = '''
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload  # noqa: E402


def _inputs(requests, name):
    """Each request's input as numpy, and where each one's rows start and end."""
    arrays = [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
    bounds = np.cumsum([0] + [len(a) for a in arrays])
    return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays)), bounds


def _answer(bounds, **outputs):
    return [pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor(name, value[a:b]) for name, value in outputs.items()])
        for a, b in zip(bounds[:-1], bounds[1:])]
'''

_MODELS = {
    "rowsum": '''
class TritonPythonModel:
    def execute(self, requests):
        x, bounds = _inputs(requests, "INPUT0")
        return _answer(bounds, OUTPUT0=workload.rowsum(x))
''',
    "featurize": '''
class TritonPythonModel:
    def initialize(self, args):
        c = workload.load_constants(Path(__file__).resolve().parent)
        self.mean, self.scale = c["mean"], c["scale"]

    def execute(self, requests):
        x, bounds = _inputs(requests, "INPUT0")
        return _answer(bounds, FEATURES=workload.featurize(x, self.mean, self.scale))
''',
    "mlp": '''
import onnxruntime as ort


class TritonPythonModel:
    def initialize(self, args):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(Path(__file__).resolve().parent / workload.ONNX_FILE), opts,
            providers=["CPUExecutionProvider"])

    def execute(self, requests):
        x, bounds = _inputs(requests, "FEATURES")
        return _answer(bounds, PROBS=self.session.run(None, {"FEATURES": x})[0])
''',
    "post": '''
class TritonPythonModel:
    def execute(self, requests):
        probs, bounds = _inputs(requests, "PROBS")
        label, score = workload.post(probs)
        return _answer(bounds, LABEL=label, SCORE=score)
''',
}

# name: (inputs, outputs) as (name, Triton type, dims per row)
_SIGNATURES = {
    "rowsum": ([("INPUT0", "TYPE_FP32", [16])], [("OUTPUT0", "TYPE_FP32", [])]),
    "featurize": ([("INPUT0", "TYPE_FP32", [16])], [("FEATURES", "TYPE_FP32", [16])]),
    "mlp": ([("FEATURES", "TYPE_FP32", [16])], [("PROBS", "TYPE_FP32", [2])]),
    "post": ([("PROBS", "TYPE_FP32", [2])],
             [("LABEL", "TYPE_INT64", []), ("SCORE", "TYPE_FP32", [])]),
}
MAX_BATCH = 64


def _tensors(kind: str, tensors: list[tuple[str, str, list[int]]], batched: bool,
             reshape: bool = True) -> str:
    out = []
    for name, dtype, dims in tensors:
        if batched:  # the batch dimension is implicit; a scalar per row is [1], shown as []
            shape = f"dims: {dims or [1]}" + (
                " reshape: { shape: [ ] }" if not dims and reshape else "")
        else:
            shape = f"dims: {[-1, *dims]}"
        out.append(f'  {{ name: "{name}" data_type: {dtype} {shape} }}')
    return f"{kind} [\n" + ",\n".join(out) + "\n]\n"


def _config(name: str, step: str, batched: bool) -> str:
    inputs, outputs = _SIGNATURES[step]
    # An ensemble's outputs take their step's shapes as the step computes them: [n, 1]
    reshape = step != "post"
    text = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH if batched else 0}\n'
            + _tensors("input", inputs, batched) + _tensors("output", outputs, batched, reshape)
            + "instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    if batched:
        text += "dynamic_batching { }\n"
    return text


def _ensemble(name: str, suffix: str, batched: bool) -> str:
    inputs, _ = _SIGNATURES["featurize"]
    _, outputs = _SIGNATURES["post"]
    steps = [("featurize", {"INPUT0": "INPUT0"}, {"FEATURES": "features"}),
             ("mlp", {"FEATURES": "features"}, {"PROBS": "probs"}),
             ("post", {"PROBS": "probs"}, {"LABEL": "LABEL", "SCORE": "SCORE"})]
    body = []
    for step, ins, outs in steps:
        maps = [f'        input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items()]
        maps += [f'        output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items()]
        body.append(f'      {{\n        model_name: "{step}{suffix}"\n        model_version: -1\n'
                    + "\n".join(maps) + "\n      }")
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: '
            f'{MAX_BATCH if batched else 0}\n' + _tensors("input", inputs, batched)
            + _tensors("output", outputs, batched, reshape=False)
            + "ensemble_scheduling {\n  step [\n" + ",\n".join(body) + "\n  ]\n}\n")


def write_repository(folder: Path, graph_files: Path) -> Path:
    """The model repository in ``folder``; ``graph_files`` holds ``workload.write_files``'s
    constants and ONNX file."""
    folder = Path(folder)
    for batched in (False, True):
        suffix = "_batched" if batched else ""
        for step, code in _MODELS.items():
            name = step + suffix
            version = folder / name / "1"
            version.mkdir(parents=True, exist_ok=True)
            (version / "model.py").write_text(_PRELUDE + code)
            shutil.copy(HERE / "workload.py", version / "workload.py")
            if step == "featurize":
                shutil.copy(graph_files / "graph_constants.npz", version)
            if step == "mlp":
                shutil.copy(graph_files / "mlp.onnx", version)
            (folder / name / "config.pbtxt").write_text(_config(name, step, batched))
        (folder / f"graph{suffix}" / "1").mkdir(parents=True, exist_ok=True)
        (folder / f"graph{suffix}" / "config.pbtxt").write_text(
            _ensemble(f"graph{suffix}", suffix, batched))
    return folder
