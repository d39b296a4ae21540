"""Adding a Python model: copy its files, run its sample in a worker process, refuse what breaks.

The sample runs before anything is written, in a worker process (so a ``model.py`` that hangs
or crashes is stopped at ``timeout_s`` and cannot take the caller down), on a copy of the files
exactly as the repository will hold them (so a file ``load`` needs but the copy lacks shows
here). It is refused with the model's own message when it cannot be imported or loaded, when
``predict`` raises on the sample, hangs, or answers outside the declared signature (a missing
output, another dtype or shape, NaN). Rows are run one at a time too: the server batches rows
of different requests into one ``predict`` call, so each row's answer must not depend on the
others (a warning says so when it does).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import InvalidInput, ModelError
from redline.models.metadata import ModelMetadata, TensorSpec, profile_inputs
from redline.models.python.code import ENTRY_FILE, REQUIREMENTS_FILE, parse_specs
from redline.models.python.contract import BrokenSignature, OutputCheck
from redline.models.python.session import RUNTIMES, SAMPLE_FILE
from redline.models.python.workers import WorkerFailed, WorkerPool, WorkerStartFailed
from redline.models.runner import ModelRunner

if TYPE_CHECKING:
    from redline.models.repository import ModelRepository

TRUST_WARNING = (
    "Adding a Python model imports its model.py and runs its load and predict on the sample: "
    "whatever code it holds runs, with your permissions, here and in every server that "
    "serves it. Only add code you wrote or have read."
)
ROW_CHECKS = 16  # sample rows also run one at a time, to see that rows are independent
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


def add_python(
    repo: ModelRepository,
    name: str,
    source: str | os.PathLike[str],
    sample: Any,
    *,
    trust_code: bool = False,
    inputs: list[TensorSpec] | Any = None,
    outputs: list[TensorSpec] | Any = None,
    timeout_s: float = 60.0,
    runtime: str | None = None,
    workers: int | None = None,
    version: int | None = None,
    task: str = "regression",
    class_labels: list[Any] | None = None,
    feature_names: list[str] | None = None,
    metrics: dict[str, float] | None = None,
    missing_values: str = "reject",
    feature_views: dict[str, str] | None = None,
    fallback: str | None = None,
    description: str = "",
    extra: dict[str, Any] | None = None,
    requires_promotion: bool = False,
    framework: str = "python",
) -> ModelMetadata:
    """Check a Python model on ``sample`` and store it as a new version, atomically.

    ``source`` is a ``model.py`` (copied alone) or a folder holding one (copied whole: weights
    and modules ``load`` and ``model.py`` use). The signature is ``inputs``/``outputs`` when
    given, else the class's ``inputs``/``outputs`` attributes. ``sample`` is rows of the one
    input (an array), or a mapping of input name to rows.
    """
    from redline.models.repository import check_name

    check_name(name)
    if not trust_code:
        raise InvalidInput(f"{TRUST_WARNING} Pass trust_code=True (--trust-code) to add it.")
    if missing_values not in ("reject", "allow"):
        raise InvalidInput("missing_values must be 'reject' or 'allow'")
    if runtime is not None and runtime not in RUNTIMES:
        raise InvalidInput(f"runtime must be one of {list(RUNTIMES)}, got {runtime!r}")
    src = Path(source)
    if src.is_dir():
        if not (src / ENTRY_FILE).is_file():
            raise InvalidInput(f"{src} has no {ENTRY_FILE}: a Python model folder holds one")
    elif not src.is_file():
        raise InvalidInput(f"model file {src} does not exist")
    elif src.suffix != ".py":
        raise InvalidInput(f"{src} is not a .py file")
    if sample is None:
        raise InvalidInput("a Python model needs a sample of its inputs (--sample): it is run "
                           "to check the model before it is added")
    label = f"model '{name}'"
    with tempfile.TemporaryDirectory(prefix="redline-add-") as tmp:
        staged = Path(tmp) / "version"
        if src.is_dir():
            shutil.copytree(src, staged, ignore=_SKIP)
        else:
            staged.mkdir()
            shutil.copyfile(src, staged / ENTRY_FILE)
        try:
            pool = WorkerPool(staged, 1, label, timeout_s, replace=False)
        except WorkerStartFailed as exc:
            if exc.invalid:
                raise InvalidInput(_here(exc.message, src, staged)) from None
            raise ModelError(_here(exc.message, src, staged),
                             traceback=_here(exc.traceback, src, staged)) from None
        except WorkerFailed as exc:
            raise ModelError(f"{label}: {exc.message}") from None
        try:
            ins, outs = _signature(pool.info, inputs, outputs, src)
            meta = ModelMetadata(
                name=name, version=0, inputs=ins, outputs=outs, sha256="", task=task,
                class_labels=class_labels, feature_names=feature_names, framework=framework,
                framework_version=platform.python_version(), metrics=dict(metrics or {}),
                missing_values=missing_values,
                created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                feature_views=dict(feature_views or {}), fallback=fallback,
                description=description, requires_promotion=requires_promotion)
            rows = _check_sample(pool, meta, sample, timeout_s, src, staged)
        finally:
            pool.close()
        arrays: dict[str, Any] = {k: _storable(v) for k, v in rows.items()}
        np.savez(staged / SAMPLE_FILE, **arrays)
        files = {p.relative_to(staged).as_posix(): _sha256(p)
                 for p in sorted(staged.rglob("*")) if p.is_file()}
        info: dict[str, Any] = {"class": pool.info.get("class"), "files": files}
        if runtime is not None:
            info["runtime"] = runtime
        if workers is not None:
            info["workers"] = workers
        if (staged / REQUIREMENTS_FILE).is_file():
            info["requirements"] = [
                line.strip() for line in (staged / REQUIREMENTS_FILE).read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
        meta.sha256 = files[ENTRY_FILE]
        meta.extra = {**(extra or {}), "python": info}
        if feature_names is not None and len(ins) == 1 and len(ins[0].shape) == 2:
            width = ins[0].shape[1]
            if width not in (-1, len(feature_names)):
                raise InvalidInput(f"{len(feature_names)} feature names given but input "
                                   f"'{ins[0].name}' has {width} columns")
            if ins[0].datatype in ("FP16", "FP32", "FP64"):
                meta.input_profile = profile_inputs(rows[ins[0].name], feature_names)
        return repo.write_files(name, meta, version, staged)


def _signature(info: dict[str, Any], inputs: Any, outputs: Any, src: Path
               ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    declared = info.get("signature")
    if inputs is None and declared is not None:
        inputs = declared[0]
    if outputs is None and declared is not None:
        outputs = declared[1]
    if inputs is None or outputs is None:
        raise InvalidInput(
            f"{src}: declare the model's signature, as class attributes of its class such as "
            "inputs = {'INPUT0': ('FP32', [-1, 16])} and outputs = {'OUTPUT0': ('FP32', [-1])} "
            "(the first dimension is the rows)")
    return parse_specs(inputs, f"{src}: inputs"), parse_specs(outputs, f"{src}: outputs")


def _check_sample(pool: WorkerPool, meta: ModelMetadata, sample: Any, timeout_s: float,
                  src: Path, staged: Path) -> dict[str, np.ndarray]:
    """The sample's rows, validated; refused when ``predict`` fails or breaks the signature."""
    if not isinstance(sample, Mapping):
        if len(meta.inputs) != 1:
            raise InvalidInput(f"the model has {len(meta.inputs)} inputs "
                               f"({', '.join(s.name for s in meta.inputs)}): give the sample as "
                               "one array per input name (an .npz with those names)")
        sample = {meta.inputs[0].name: sample}
    try:
        rows = ModelRunner(meta).validate(sample)
    except InvalidInput as exc:
        raise InvalidInput(f"the sample does not match the model's signature: {exc.message}"
                           ) from None
    count = len(next(iter(rows.values())))
    if count == 0:
        raise InvalidInput("the sample has no rows")
    check = OutputCheck(meta.outputs)
    whole = _run(pool, check, rows, count, timeout_s, "the sample", src, staged)
    differs = []
    for i in range(min(count, ROW_CHECKS)):
        one = _run(pool, check, {k: v[i:i + 1] for k, v in rows.items()}, 1, timeout_s,
                   f"sample row {i} alone", src, staged)
        differs += [n for n in one if not _same(one[n], whole[n][i:i + 1]) and n not in differs]
    if differs:
        from redline.models.repository import RegistrationWarning

        warnings.warn(
            f"model '{meta.name}': output(s) {differs} of a sample row run alone differ from the "
            "same row run with the whole sample. The server runs the rows of several requests in "
            "one predict call, so a row's answer would depend on the other requests; make each "
            "row's answer depend on that row only, or disable batching for this model "
            "(models.<name>.batching.enabled: false)", RegistrationWarning, stacklevel=3)
    return rows


def _run(pool: WorkerPool, check: OutputCheck, rows: dict[str, np.ndarray], count: int,
         timeout_s: float, what: str, src: Path, staged: Path) -> dict[str, np.ndarray]:
    try:
        return check(pool.predict(rows, timeout_s), count)
    except WorkerFailed as exc:
        raised = "" if exc.lost else "predict raised "
        raise ModelError(f"{src}: on {what}, {raised}{_here(exc.message, src, staged)}",
                         traceback=_here(exc.traceback, src, staged)) from None
    except BrokenSignature as exc:
        raise ModelError(f"{src}: on {what}, {src.name if src.is_file() else ENTRY_FILE} broke "
                         f"its signature: {exc}") from None


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))
    return bool(np.array_equal(a, b))


def _here(text: str, src: Path, staged: Path) -> str:
    """A message about the staged copy, naming the user's own files instead."""
    where = src if src.is_dir() else src.parent
    text = text.replace(str(staged.resolve()), str(where)).replace(str(staged), str(where))
    if not src.is_dir() and src.name != ENTRY_FILE:
        text = text.replace(f"{where}/{ENTRY_FILE}", str(src)).replace(
            f"({ENTRY_FILE}, line", f"({src.name}, line")
    return text


def _storable(array: np.ndarray) -> np.ndarray:
    """Strings as a unicode array: an .npz read without pickle cannot hold objects."""
    return array.astype(str) if array.dtype.kind == "O" else array


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
