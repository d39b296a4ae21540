"""Convert a trained model to ONNX and prove the conversion agrees with the original.

Every model enters the repository as ONNX (see DESIGN.md: ONNX Runtime is the one engine). A
conversion is only accepted after the original framework and ONNX Runtime have both run on the
caller's sample and agree within a tolerance; otherwise ``ConversionError`` says where they
differ most and what to do. Framework libraries are imported lazily, so ``redline`` without the
``convert``/``torch`` extras still imports this module.

Canonical signature: one 2-D float32 input named ``input`` (``[batch, n_features]``; for PyTorch
whatever rank the sample has), outputs ``label`` + ``probabilities`` for classifiers (plain
tensors, never a ZipMap), ``variable`` for regressors and ``output`` for PyTorch modules.
"""

from __future__ import annotations

import copy
import io
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from redline.errors import ConversionError

SUPPORTED_FRAMEWORKS = ("scikit-learn", "lightgbm", "xgboost", "pytorch", "onnx")
DEFAULT_OPSET = 17  # supported by skl2onnx, torch.onnx and onnxruntime
ML_OPSET = 3  # the newest ai.onnx.ml the LightGBM/XGBoost converters (onnxmltools) emit
BOOSTER_MAX_OPSET = 15  # onnxmltools' own entry point refuses anything newer
INPUT_NAME = "input"
CLASSIFIER_OUTPUTS = ["label", "probabilities"]
REGRESSOR_OUTPUTS = ["variable"]
TORCH_OUTPUTS = ["output"]

# Estimators whose trees route NaN down a learned branch, so missing values are legal input.
_NAN_NATIVE = {"HistGradientBoostingClassifier", "HistGradientBoostingRegressor"}


@dataclass
class ConvertedModel:
    """An ONNX model plus what the repository records about it (task, labels, parity result)."""

    onnx_bytes: bytes
    framework: str
    framework_version: str
    task: str
    class_labels: list[Any] | None
    input_name: str
    output_names: list[str]
    n_features: int
    max_abs_diff: float
    handles_missing: bool


def detect_framework(model: Any) -> str:
    """Name the framework ``model`` comes from, or raise ``ConversionError`` if unsupported.

    Detection looks at the class's module (and its bases) so no framework is imported for it.
    """
    if isinstance(model, (bytes, bytearray)) or _module_root(type(model)) == "onnx":
        return "onnx"
    for klass in type(model).__mro__:
        root = _module_root(klass)
        if root == "sklearn":
            return "scikit-learn"
        if root == "lightgbm":
            return "lightgbm"
        if root == "xgboost":
            return "xgboost"
        if root == "torch":
            return "pytorch"
    raise ConversionError(
        f"cannot convert a {type(model).__module__}.{type(model).__qualname__}: supported "
        f"frameworks are {', '.join(SUPPORTED_FRAMEWORKS)} (scikit-learn estimators and "
        "Pipelines, LightGBM, XGBoost, PyTorch nn.Module, or an ONNX model). Convert it to ONNX "
        "yourself and add the .onnx file instead.",
        model_type=type(model).__qualname__,
    )


def convert(
    model: Any, sample: np.ndarray, *, tolerance: float = 1e-4, opset: int | None = None
) -> ConvertedModel:
    """Convert ``model`` to ONNX and check it against the original on ``sample``.

    ``sample`` is representative input rows (cast to float32). Outputs are compared elementwise;
    a difference counts as ``|onnx - original| / max(1, |original|)`` so that regressors with
    large targets are judged relatively and probabilities absolutely. Raises
    ``ConversionError`` when they differ by more than ``tolerance``. Typical real refusal: a
    Pipeline that scales in float32 before trees moves a value across a split for some row.
    """
    framework = detect_framework(model)
    x = _as_sample(sample, framework)
    target = opset or DEFAULT_OPSET
    if framework == "pytorch":
        converted = _convert_torch(model, x, target)
    elif framework == "onnx":
        converted = _load_onnx(model, x)
    else:
        _check_n_features(model, x)
        if framework == "lightgbm" and _is_lgbm_booster(model):
            converted = _convert_lgbm_booster(model, x, target)
        else:
            converted = _convert_sklearn_api(model, x, target, framework)
    if framework != "onnx":
        converted.max_abs_diff = _check_parity(model, converted, x, tolerance)
    return converted


# --- per-framework converters --------------------------------------------------------------


def _convert_sklearn_api(model: Any, x: np.ndarray, opset: int, framework: str) -> ConvertedModel:
    """scikit-learn estimators/Pipelines and sklearn-API LightGBM/XGBoost models, via skl2onnx."""
    skl2onnx = _import("skl2onnx", "convert")
    from skl2onnx.common.data_types import FloatTensorType

    _register_boosters()
    _patch_skl2onnx_missing_flags()
    final_framework = _module_root(type(_final_estimator(model)))  # a Pipeline may end in one
    if final_framework == "lightgbm":
        _patch_lightgbm_thresholds()
    if final_framework == "xgboost":
        model = _xgb_with_plain_feature_names(model)
    final = _final_estimator(model)
    is_classifier = hasattr(final, "classes_")
    if is_classifier and not hasattr(model, "predict_proba"):
        raise ConversionError(
            f"{type(final).__name__} has no predict_proba, so its probabilities cannot be checked "
            "or served; enable it (e.g. SVC(probability=True)) or use a calibrated classifier."
        )
    options = {id(final): {"zipmap": False}} if is_classifier else None
    try:
        onx = skl2onnx.convert_sklearn(
            model,
            initial_types=[(INPUT_NAME, FloatTensorType([None, x.shape[1]]))],
            options=options,
            target_opset={"": opset, "ai.onnx.ml": ML_OPSET},
        )
    except Exception as exc:  # converters raise many types; the user needs one clear error
        raise _conversion_failed(model, exc) from exc
    outputs = CLASSIFIER_OUTPUTS if is_classifier else REGRESSOR_OUTPUTS
    _rename_outputs(onx, outputs)
    labels = [_plain(c) for c in final.classes_] if is_classifier else None
    return _result(onx, framework, model, is_classifier, labels, x, _handles_missing(final))


def _convert_lgbm_booster(booster: Any, x: np.ndarray, opset: int) -> ConvertedModel:
    """A raw ``lightgbm.Booster`` (no sklearn wrapper) via onnxmltools, without ZipMap."""
    onnxmltools = _import("onnxmltools", "convert")
    from onnxmltools.convert.common.data_types import FloatTensorType

    n_classes = _lgbm_booster_classes(booster)
    _patch_lightgbm_thresholds()
    try:
        onx = onnxmltools.convert_lightgbm(
            booster,
            initial_types=[(INPUT_NAME, FloatTensorType([None, x.shape[1]]))],
            target_opset=min(opset, BOOSTER_MAX_OPSET),
            zipmap=False,
        )
    except Exception as exc:
        raise _conversion_failed(booster, exc) from exc
    is_classifier = n_classes is not None
    _rename_outputs(onx, CLASSIFIER_OUTPUTS if is_classifier else REGRESSOR_OUTPUTS)
    labels = list(range(n_classes)) if n_classes is not None else None
    return _result(onx, "lightgbm", booster, is_classifier, labels, x, True)


def _convert_torch(module: Any, x: np.ndarray, opset: int) -> ConvertedModel:
    """A PyTorch ``nn.Module`` via the TorchScript exporter, batch axis dynamic."""
    torch = _import("torch", "torch")
    module.eval()
    dynamic = {INPUT_NAME: {0: "batch"}, TORCH_OUTPUTS[0]: {0: "batch"}}
    buf = io.BytesIO()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter, chosen above
            torch.onnx.export(
                module,
                (torch.from_numpy(x),),
                buf,
                input_names=[INPUT_NAME],
                output_names=TORCH_OUTPUTS,
                dynamic_axes=dynamic,
                opset_version=opset,
                dynamo=False,  # the legacy exporter works offline and needs no onnxscript
            )
    except Exception as exc:
        raise _conversion_failed(module, exc) from exc
    labels = getattr(module, "classes_", None)  # opt-in: a module may declare its class labels
    return ConvertedModel(
        onnx_bytes=buf.getvalue(),
        framework="pytorch",
        framework_version=str(torch.__version__),
        task="classification" if labels is not None else "regression",
        class_labels=[_plain(c) for c in labels] if labels is not None else None,
        input_name=INPUT_NAME,
        output_names=list(TORCH_OUTPUTS),
        n_features=int(np.prod(x.shape[1:])),
        max_abs_diff=0.0,
        handles_missing=False,
    )


def _load_onnx(model: Any, x: np.ndarray) -> ConvertedModel:
    """An ONNX model given as bytes or ``ModelProto``: checked to load and run on the sample."""
    import onnx

    data = bytes(model) if isinstance(model, (bytes, bytearray)) else model.SerializeToString()
    session = _ort_session(data)
    inputs = session.get_inputs()
    outputs = [o.name for o in session.get_outputs()]
    try:
        session.run(None, {inputs[0].name: x})
    except Exception as exc:
        raise ConversionError(
            f"the ONNX model does not run on the sample: {str(exc).rstrip('. ')}. "
            "Check the sample's shape "
            "and dtype against the model's input."
        ) from exc
    is_classifier = "probabilities" in outputs
    return ConvertedModel(
        onnx_bytes=data,
        framework="onnx",
        framework_version=str(onnx.__version__),
        task="classification" if is_classifier else "regression",
        class_labels=None,
        input_name=inputs[0].name,
        output_names=outputs,
        n_features=int(np.prod(x.shape[1:])),
        max_abs_diff=0.0,
        handles_missing=False,
    )


# --- the parity check ----------------------------------------------------------------------


def _check_parity(model: Any, converted: ConvertedModel, x: np.ndarray, tolerance: float) -> float:
    """Run both sides on ``x``; return the largest absolute difference, raise if too large."""
    expected = _reference_outputs(model, converted, x)
    session = _ort_session(converted.onnx_bytes)
    try:
        got = session.run(None, {converted.input_name: x})
    except Exception as exc:
        raise ConversionError(f"the converted ONNX model fails on the sample: {exc}") from exc
    actual = dict(zip([o.name for o in session.get_outputs()], got, strict=True))
    score_name = converted.output_names[-1]  # probabilities / variable / output
    ref = np.asarray(expected[score_name], dtype=np.float64).reshape(len(x), -1)
    out = np.asarray(actual[score_name], dtype=np.float64).reshape(len(x), -1)
    if ref.shape != out.shape:
        raise ConversionError(
            f"the converted model's '{score_name}' has shape {out.shape[1:]} per row but the "
            f"original gives {ref.shape[1:]}; the model cannot be converted faithfully."
        )
    abs_diff = np.abs(out - ref)
    abs_diff[np.isnan(out) & np.isnan(ref)] = 0.0
    abs_diff[np.isnan(abs_diff)] = np.inf  # NaN on one side only is a total disagreement
    scaled = abs_diff / np.maximum(1.0, np.abs(np.nan_to_num(ref)))
    row, col = np.unravel_index(int(np.argmax(scaled)), scaled.shape)
    if scaled[row, col] > tolerance:
        raise ConversionError(
            f"conversion refused: the ONNX model's '{score_name}' differs from the original by "
            f"{abs_diff[row, col]:.3g} (relative {scaled[row, col]:.3g}) at sample row {row}, "
            f"column {col} (original {ref[row, col]:.9g}, ONNX {out[row, col]:.9g}); the "
            f"tolerance is {tolerance:g}. If the difference is float32 rounding, pass a larger "
            "tolerance (--tolerance); otherwise check the model and the sample.",
            max_abs_diff=float(abs_diff[row, col]),
            row=int(row),
            tolerance=tolerance,
        )
    if converted.task == "classification" and "label" in expected:
        _check_labels(expected["label"], actual["label"], ref, tolerance)
    return float(abs_diff.max()) if abs_diff.size else 0.0


def _check_labels(ref_labels: Any, onnx_labels: Any, proba: np.ndarray, tolerance: float) -> None:
    """Labels must match wherever the top two probabilities are further apart than ``tolerance``."""
    ref_l = np.asarray(ref_labels).ravel()
    out_l = np.asarray(onnx_labels).ravel()
    if proba.shape[1] >= 2:
        top2 = np.sort(proba, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
    else:
        margin = np.full(len(ref_l), np.inf)
    same = np.array([_plain(a) == _plain(b) for a, b in zip(ref_l, out_l, strict=True)])
    bad = np.flatnonzero(~same & (margin > tolerance))
    if bad.size:
        row = int(bad[0])
        raise ConversionError(
            f"conversion refused: the ONNX model predicts label {_plain(out_l[row])!r} but the "
            f"original predicts {_plain(ref_l[row])!r} at sample row {row} ({bad.size} rows "
            f"disagree) although their probabilities agree within the tolerance {tolerance:g}; "
            "check the model (its classes_) and the sample.",
            row=row,
            tolerance=tolerance,
        )


def _reference_outputs(model: Any, converted: ConvertedModel, x: np.ndarray) -> dict[str, Any]:
    """What the original framework returns for ``x``, under the canonical output names."""
    try:
        if converted.framework == "pytorch":
            torch = _import("torch", "torch")
            with torch.no_grad():
                out = model(torch.from_numpy(x))
            if not isinstance(out, torch.Tensor):
                raise ConversionError(
                    f"the module returns {type(out).__name__}; redline converts modules whose "
                    "forward returns one tensor. Wrap it in a module that returns one."
                )
            return {"output": out.detach().cpu().numpy()}
        if _is_lgbm_booster(model):
            raw = np.asarray(model.predict(x))
            if converted.task == "classification":
                proba = np.column_stack([1.0 - raw, raw]) if raw.ndim == 1 else raw
                return {"label": np.argmax(proba, axis=1), "probabilities": proba}
            return {"variable": raw}
        if converted.task == "classification":
            return {"label": model.predict(x), "probabilities": model.predict_proba(x)}
        return {"variable": model.predict(x)}
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(
            f"the original {type(model).__name__} fails on the sample: "
            f"{str(exc).rstrip('. ')}. The sample must be "
            "rows the model accepts (same features, in training order)."
        ) from exc


# --- helpers -------------------------------------------------------------------------------


_REGISTERED = False


def _register_boosters() -> None:
    """Teach skl2onnx the LightGBM/XGBoost sklearn-API models (once), so Pipelines work too."""
    global _REGISTERED
    if _REGISTERED:
        return
    from skl2onnx import update_registered_converter
    from skl2onnx.common.shape_calculator import (
        calculate_linear_classifier_output_shapes,
        calculate_linear_regressor_output_shapes,
    )

    cls_opts = {"nocl": [True, False], "zipmap": [True, False, "columns"]}
    try:
        from lightgbm import LGBMClassifier, LGBMRegressor
        from onnxmltools.convert.lightgbm.operator_converters.LightGbm import convert_lightgbm

        update_registered_converter(
            LGBMClassifier,
            "LightGbmLGBMClassifier",
            calculate_linear_classifier_output_shapes,
            convert_lightgbm,
            options=cls_opts,
        )
        update_registered_converter(
            LGBMRegressor,
            "LightGbmLGBMRegressor",
            calculate_linear_regressor_output_shapes,
            convert_lightgbm,
            options={"split": None},
        )
    except ImportError:
        pass
    try:
        from onnxmltools.convert.xgboost.operator_converters.XGBoost import convert_xgboost
        from xgboost import XGBClassifier, XGBRegressor

        update_registered_converter(
            XGBClassifier,
            "XGBoostXGBClassifier",
            calculate_linear_classifier_output_shapes,
            convert_xgboost,
            options=cls_opts,
        )
        update_registered_converter(
            XGBRegressor,
            "XGBoostXGBRegressor",
            calculate_linear_regressor_output_shapes,
            convert_xgboost,
        )
    except ImportError:
        pass
    _REGISTERED = True


def _patch_skl2onnx_missing_flags() -> None:
    """Work around skl2onnx 1.20 passing numpy booleans for HistGradientBoosting's
    ``nodes_missing_value_tracks_true`` (onnx >= 1.17 rejects them): cast them to int."""
    from skl2onnx.common import tree_ensemble

    original = tree_ensemble.add_node
    if getattr(original, "_redline_int_flags", False):
        return

    def add_node(*args: Any, nodes_missing_value_tracks_true: Any = 0, **kwargs: Any) -> Any:
        flag = int(nodes_missing_value_tracks_true)
        return original(*args, nodes_missing_value_tracks_true=flag, **kwargs)

    add_node._redline_int_flags = True  # type: ignore[attr-defined]
    tree_ensemble.add_node = add_node


def _patch_lightgbm_thresholds() -> None:
    """Make LightGBM splits exact in float32.

    LightGBM tests ``x <= t`` with a double ``t``; ONNX stores ``t`` as the *nearest* float32,
    which can round up past an input value and send that row the wrong way. For a float32 ``x``,
    ``x <= t`` holds exactly when ``x <= floor32(t)`` (the largest float32 not above ``t``), so
    the dumped thresholds are rounded down before onnxmltools builds the graph.
    """
    from onnxmltools.convert.lightgbm.operator_converters import LightGbm

    original = LightGbm.dump_booster_model
    if getattr(original, "_redline_floor32", False):
        return

    def dump_booster_model(*args: Any, **kwargs: Any) -> Any:
        dump, info = original(*args, **kwargs)
        for tree in dump.get("tree_info", []):
            _floor32_thresholds(tree.get("tree_structure", {}))
        return dump, info

    dump_booster_model._redline_floor32 = True  # type: ignore[attr-defined]
    LightGbm.dump_booster_model = dump_booster_model


def _floor32_thresholds(node: dict[str, Any]) -> None:
    stack = [node]
    while stack:
        current = stack.pop()
        if current.get("decision_type") == "<=" and isinstance(
            current.get("threshold"), (int, float)
        ):
            t = float(current["threshold"])
            with np.errstate(over="ignore"):  # thresholds beyond float32 floor to its max below
                f = np.float32(t)
            if float(f) > t:
                f = np.nextafter(f, np.float32(-np.inf))
            current["threshold"] = float(f)
        stack.extend(c for c in (current.get("left_child"), current.get("right_child")) if c)


def _xgb_with_plain_feature_names(model: Any) -> Any:
    """A copy whose booster uses the f0..fN names onnxmltools parses (training on a DataFrame
    stores the column names in the tree dump instead)."""
    final = _final_estimator(model)
    booster = final.get_booster()
    if not booster.feature_names:
        return model
    model = copy.deepcopy(model)
    booster = _final_estimator(model).get_booster()
    booster.feature_names = None
    booster.feature_types = None
    return model


def _rename_outputs(onx: Any, names: list[str]) -> None:
    """Rename the graph outputs, in order, to the canonical ``names`` (edges follow the rename)."""
    graph = onx.graph
    if len(graph.output) != len(names):
        raise ConversionError(
            f"the converter produced outputs {[o.name for o in graph.output]}, expected "
            f"{len(names)} ({', '.join(names)}); this model type is not supported."
        )
    if any(node.op_type == "ZipMap" for node in graph.node):
        raise ConversionError("the converter emitted a ZipMap; redline serves plain tensors only")
    mapping = {o.name: new for o, new in zip(graph.output, names, strict=True) if o.name != new}
    if not mapping:
        return
    taken = {n for node in graph.node for n in (*node.input, *node.output)}
    # an internal edge that already uses a canonical name moves aside
    for new in list(mapping.values()):
        if new in taken and new not in mapping:
            mapping[new] = f"{new}_internal"
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
    for out in graph.output:
        out.name = mapping.get(out.name, out.name)


def _result(
    onx: Any,
    framework: str,
    model: Any,
    is_classifier: bool,
    labels: list[Any] | None,
    x: np.ndarray,
    handles_missing: bool,
) -> ConvertedModel:
    return ConvertedModel(
        onnx_bytes=onx.SerializeToString(),
        framework=framework,
        framework_version=_framework_version(framework),
        task="classification" if is_classifier else "regression",
        class_labels=labels,
        input_name=INPUT_NAME,
        output_names=list(CLASSIFIER_OUTPUTS if is_classifier else REGRESSOR_OUTPUTS),
        n_features=int(x.shape[1]),
        max_abs_diff=0.0,
        handles_missing=handles_missing,
    )


def _as_sample(sample: Any, framework: str) -> np.ndarray:
    """The sample as a C-contiguous float32 array; 2-D except for PyTorch."""
    try:
        x = np.ascontiguousarray(np.asarray(sample, dtype=np.float32))
    except (TypeError, ValueError) as exc:
        raise ConversionError(
            f"the sample cannot be read as float32 numbers ({exc}); pass numeric rows."
        ) from exc
    if x.ndim < 2 or (framework != "pytorch" and x.ndim != 2) or x.shape[0] == 0:
        raise ConversionError(
            f"the sample has shape {x.shape}; pass a non-empty 2-D array [rows, features]"
            + (" (or higher rank for PyTorch)" if framework == "pytorch" else "")
            + " of representative inputs."
        )
    return x


def _check_n_features(model: Any, x: np.ndarray) -> None:
    expected = getattr(model, "n_features_in_", None)
    if expected is None and _is_lgbm_booster(model):
        expected = model.num_feature()
    if expected is not None and int(expected) != x.shape[1]:
        raise ConversionError(
            f"the sample has {x.shape[1]} features per row but the model was trained on "
            f"{int(expected)}; pass rows with the training features in training order."
        )


def _final_estimator(model: Any) -> Any:
    """The last step of a (possibly nested) Pipeline, or the model itself."""
    while hasattr(model, "steps"):
        model = model.steps[-1][1]
    return model


def _handles_missing(final: Any) -> bool:
    native = _module_root(type(final)) in ("lightgbm", "xgboost")
    return native or type(final).__name__ in _NAN_NATIVE


def _is_lgbm_booster(model: Any) -> bool:
    return _module_root(type(model)) == "lightgbm" and type(model).__name__ == "Booster"


def _lgbm_booster_classes(booster: Any) -> int | None:
    """Number of classes of a raw Booster (None for regression), read from its objective."""
    objective = str(booster.dump_model().get("objective", "")).split(" ")[0]
    if objective in ("binary", "cross_entropy", "xentropy"):
        return 2
    if objective.startswith("multiclass") or objective in ("softmax", "multiclassova"):
        return int(booster.dump_model().get("num_class", 1))
    return None


def _module_root(klass: type) -> str:
    return (getattr(klass, "__module__", "") or "").split(".")[0]


def _framework_version(framework: str) -> str:
    module = {"scikit-learn": "sklearn", "lightgbm": "lightgbm", "xgboost": "xgboost"}[framework]
    return str(_import(module, "convert").__version__)


def _plain(value: Any) -> Any:
    """numpy scalars to Python ints/floats/strs so labels are JSON-serialisable."""
    return value.item() if isinstance(value, np.generic) else value


def _import(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConversionError(
            f"converting this model needs the '{module}' package: pip install 'redline[{extra}]'"
        ) from exc


def _ort_session(data: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ConversionError(f"the ONNX model cannot be loaded by onnxruntime: {exc}") from exc


def _conversion_failed(model: Any, exc: Exception) -> ConversionError:
    return ConversionError(
        f"converting {type(model).__name__} to ONNX failed: {str(exc).rstrip('.')}. Check that "
        "every step of the model is supported by skl2onnx/onnxmltools/torch.onnx, or add an "
        "ONNX file instead.",
        model_type=type(model).__name__,
    )
