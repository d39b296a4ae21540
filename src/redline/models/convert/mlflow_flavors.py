"""Loading an MLflow flavor's framework object, running no code from the model unless trusted.

Native formats (XGBoost files, a LightGBM ``Booster``, PyTorch's ``pt2``) load as they are, with
MLflow's own checks on; skops files whose types are known load through skops; anything that can
run code when loaded (a pickle, ``code_paths``, a skops file trusting other types) needs
``trust_pickle``. The object comes back in the shape ``convert`` takes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from redline.errors import ConversionError
from redline.models.convert.frameworks import import_framework
from redline.models.convert.mlflow_store import (
    PYFUNC_HINT,
    MlflowModel,
    first_line,
    mlflow_scope,
)

# skops types that construct nothing but the estimators they name: MLflow writes this list for a
# LightGBM sklearn-API model; scikit-learn's own types are trusted by skops itself.
_SAFE_SKOPS_TYPES = frozenset({
    "collections.OrderedDict",
    "lightgbm.basic.Booster",
    "lightgbm.sklearn.LGBMClassifier",
    "lightgbm.sklearn.LGBMRegressor",
    "lightgbm.sklearn.LGBMRanker",
})
_XGB_CLASSIFIERS = ("binary:logistic", "multi:softprob")


def load_native(model: MlflowModel, flavor: str, trust_pickle: bool) -> Any:
    """The framework object behind ``flavor``: a scikit-learn estimator, a LightGBM or XGBoost
    model, or a PyTorch module. A format that can run code needs ``trust_pickle``."""
    conf = model.flavors[flavor]
    risk = pickle_risk(flavor, conf, model.folder)
    if risk is not None and not trust_pickle:
        raise ConversionError(
            f"--from-mlflow {model.uri}: its {flavor} flavor is stored as {risk}: loading it "
            "can run code the file holds. Only import models you produced yourself; pass "
            "--trust-pickle to import it anyway (redline never loads it at serving time)")
    skops_file = _skops_file(flavor, conf)
    try:
        if skops_file is not None and risk is None:
            skops_io = _import_skops_io()
            types = conf.get("skops_trusted_types") or None
            native = skops_io.load(str(model.folder / skops_file), trusted=types)
        else:
            module = import_framework(f"mlflow.{flavor}", "mlflow")
            with mlflow_scope(None, allow_code=trust_pickle):
                native = module.load_model(str(model.folder))
    except ConversionError:
        raise
    except Exception as exc:
        said = first_line(exc)
        if "MLFLOW_ALLOW_MODEL_CODE_EXECUTION" in said or "Untrusted types" in said:
            raise ConversionError(
                f"--from-mlflow {model.uri}: loading its {flavor} flavor would run code from "
                "the model files; pass --trust-pickle if you produced it yourself") from exc
        raise ConversionError(f"--from-mlflow {model.uri}: its {flavor} flavor cannot be "
                              f"loaded ({said})") from exc
    if flavor == "pytorch":
        return _plain_module(native)
    if flavor == "xgboost" and type(native).__name__ == "Booster":
        return _xgboost_estimator(native, model.uri)
    return native


def _import_skops_io() -> Any:
    """``skops.io``, without importing PyTorch on the way. At import skops lists
    scikit-learn's estimators by walking every package of scikit-learn, and one of them,
    ``sklearn.externals.array_api_compat.torch``, imports all of PyTorch when it is installed
    (seconds) though it holds no estimator (the walk skips ``externals``' modules, and a package
    that does not import). It is held out for the walk only, when nothing has imported it yet."""
    import sys

    import_framework("skops", "mlflow")
    held_out = "sklearn.externals.array_api_compat.torch"
    hold = held_out not in sys.modules
    if hold:
        sys.modules[held_out] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import skops.io
    finally:
        if hold and sys.modules.get(held_out, False) is None:
            del sys.modules[held_out]
    return skops.io


def pickle_risk(flavor: str, conf: dict[str, Any], folder: Path) -> str | None:
    """What in the flavor's files can run code when loaded (``None``: nothing)."""
    if conf.get("code"):
        return f"code logged beside it ({conf['code']})"
    if flavor == "sklearn" or (flavor == "lightgbm" and not _is_booster_class(conf)):
        fmt = conf.get("serialization_format", "pickle")
        data = conf.get("pickled_model") or conf.get("data") or "model.pkl"
        if fmt != "skops":
            return f"a {fmt} file ({data})"
        untrusted = set(conf.get("skops_trusted_types") or ()) - _SAFE_SKOPS_TYPES
        if untrusted:
            return (f"a skops file that trusts {', '.join(sorted(untrusted))}, which skops "
                    f"itself does not ({data})")
    if flavor == "pytorch" and not (folder / _pytorch_data(conf) / "model.pt2").is_file():
        return f"a pickle ({_pytorch_data(conf)}/model.pth)"
    return None


def _is_booster_class(conf: dict[str, Any]) -> bool:
    return str(conf.get("model_class", "")).endswith(".Booster")


def _skops_file(flavor: str, conf: dict[str, Any]) -> str | None:
    if conf.get("serialization_format") != "skops":
        return None
    if flavor == "sklearn":
        return str(conf.get("pickled_model", "model.skops"))
    if flavor == "lightgbm" and not _is_booster_class(conf):
        return str(conf.get("data", "model.skops"))
    return None


def _pytorch_data(conf: dict[str, Any]) -> Path:
    return Path(str(conf.get("model_data", "data")))


def _plain_module(native: Any) -> Any:
    """A module the ONNX exporter can trace: an exported program's module (the ``pt2`` format)
    refuses ``eval()``, so it runs inside a plain module with its weights frozen."""
    torch = import_framework("torch", "torch")
    if not isinstance(native, torch.fx.GraphModule) or hasattr(native, "classes_"):
        return native
    for param in native.parameters():
        param.requires_grad_(False)

    module: Any = torch.nn.Module

    class ExportedProgramModule(module):
        def __init__(self, program: Any) -> None:
            super().__init__()
            object.__setattr__(self, "program", program)  # not a child: eval() stays out

        def forward(self, x: Any) -> Any:
            return self.program(x)

    return ExportedProgramModule(native)


def _xgboost_estimator(booster: Any, uri: str) -> Any:
    """A raw XGBoost ``Booster`` (``xgb.train``) as the sklearn-API model the converter takes."""
    xgb = import_framework("xgboost", "convert")
    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    if objective in _XGB_CLASSIFIERS:
        estimator = xgb.XGBClassifier()
    elif objective.startswith("reg:"):
        estimator = xgb.XGBRegressor()
    else:
        raise ConversionError(
            f"--from-mlflow {uri}: an XGBoost Booster with objective '{objective}' cannot be "
            f"converted (redline converts {', '.join(_XGB_CLASSIFIERS)} and reg:*); "
            f"{PYFUNC_HINT}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.ubj"
        booster.save_model(str(path))
        estimator.load_model(str(path))
    return estimator
