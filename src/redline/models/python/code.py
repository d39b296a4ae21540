"""The user's code: import ``model.py`` from a version folder, find its class, read its signature.

A ``model.py`` holds one class with ``predict(self, inputs) -> outputs`` (dicts of name -> numpy
array, rows first) and, optionally, ``load(self, folder)``; it may declare its signature as class
attributes ``inputs`` and ``outputs``. Every error here names the user's file and line: a broken
import is the user's to fix, and the traceback into redline's own frames would not help.

The folder is imported as a package of its own under a unique name, so two versions of a model
(loaded side by side during a hot swap) never share a module, and ``model.py`` can import its
sibling files relatively (``from . import features``). Nothing is written into the folder: no
``__pycache__`` beside ``model.py`` or its siblings, so a version holds the files it was added
with and their recorded checksums, whether or not Python writes bytecode where it runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import InvalidInput, ModelError
from redline.models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY
from redline.models.metadata import TensorSpec

ENTRY_FILE = "model.py"
CLASS_NAME = "Model"  # the class taken when model.py defines several
REQUIREMENTS_FILE = "requirements.txt"
_PACKAGE_PREFIX = "_redline_model_"
_counter = itertools.count(1)


def where(exc: BaseException, folder: Path) -> str:
    """`` (model.py, line 12)``: the innermost frame of ``exc`` in the model's folder, or ''."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        name = _relative(exc.filename, folder)
        if name is not None:
            return f" ({name}, line {exc.lineno})"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = _relative(frame.filename, folder)
        if name is not None:
            return f" ({name}, line {frame.lineno})"
    return ""


def user_traceback(exc: BaseException, folder: Path) -> str:
    """The traceback from the first frame in the model's folder on: what the user can act on."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if _relative(f.filename, folder) is not None),
                 0)
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames[first:]),
             *traceback.format_exception_only(type(exc), exc)]
    return "".join(lines).rstrip()


def _relative(filename: str, folder: Path) -> str | None:
    try:
        return Path(filename).resolve().relative_to(folder.resolve()).as_posix()
    except (ValueError, OSError):
        return None


def describe_failure(exc: BaseException, folder: Path) -> str:
    """``ValueError: bad row (model.py, line 12)``, with a hint for a missing package."""
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if isinstance(exc, SyntaxError):
        text = f"SyntaxError: {exc.msg}"
    text += where(exc, folder)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file():
            text += (f"; '{top}' is a file of the model's folder: import it relatively "
                     f"(from . import {top})")
        else:
            listed = folder / REQUIREMENTS_FILE
            text += (f"; install '{top}' where redline runs"
                     + (f" (the model lists its packages in {REQUIREMENTS_FILE})"
                        if listed.is_file() else ""))
    return text


def import_model(folder: Path) -> types.ModuleType:
    """Import ``folder/model.py`` as a fresh module; a failure is a ``ModelError`` naming the
    file and line."""
    path = folder / ENTRY_FILE
    if not path.is_file():
        raise ModelError(f"{path} does not exist: a Python model version holds {ENTRY_FILE}")
    try:
        return import_from_folder(f"{_PACKAGE_PREFIX}{next(_counter)}", folder, path)
    except Exception as exc:  # noqa: BLE001 - the user's import may raise anything
        raise ModelError(f"cannot import {path}: {describe_failure(exc, folder)}",
                         traceback=user_traceback(exc, folder)) from None


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A user's file loaded from its source, its bytecode never written beside it."""

    def set_data(self, path: str, data: Any, *, _mode: int = 0o666) -> None:
        return None  # (the one place a source loader writes: its bytecode cache)


def _folder_finder(folder: Path) -> importlib.machinery.FileFinder:
    return importlib.machinery.FileFinder(
        str(folder),
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (_SourceOnlyLoader, importlib.machinery.SOURCE_SUFFIXES),
        (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES))


def import_from_folder(package_name: str, folder: Path, path: Path) -> types.ModuleType:
    """``path`` (a file of ``folder``) imported as ``package_name.<stem>``, ``folder`` being the
    package, so the file imports its siblings relatively; no bytecode is written into the
    folder, for the file or its siblings (the module doc). A failure forgets what it imported
    and raises the user's exception."""
    package = types.ModuleType(package_name)
    package.__path__ = [str(folder)]
    package.__file__ = None
    # siblings and subpackages are found through the import system's finder for their folder:
    # this one's, for the folder and every folder under it
    for place in [folder, *(p for p in folder.rglob("*")
                            if p.is_dir() and p.name != "__pycache__")]:
        sys.path_importer_cache[str(place)] = _folder_finder(place)
    sys.modules[package_name] = package
    name = f"{package_name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path,
                                                  loader=_SourceOnlyLoader(name, str(path)))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        forget(module)
        raise
    return module


def forget(module: types.ModuleType) -> None:
    """Drop a model's modules from ``sys.modules`` (a retired version can then be collected)."""
    package = module.__name__.rsplit(".", 1)[0]
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        sys.modules.pop(name, None)


def model_class(module: types.ModuleType, folder: Path) -> type:
    """The class ``Model``, else the one class of ``model.py`` that has a ``predict``."""
    path = folder / ENTRY_FILE
    found = getattr(module, CLASS_NAME, None)
    if isinstance(found, type):
        if not callable(getattr(found, "predict", None)):
            raise ModelError(f"{path}: class {CLASS_NAME} has no predict(self, inputs) method")
        return found
    own = [v for v in vars(module).values()
           if isinstance(v, type) and v.__module__ == module.__name__
           and callable(getattr(v, "predict", None))]
    if len(own) == 1:
        return own[0]
    if not own:
        raise ModelError(f"{path} defines no class with a predict(self, inputs) method; define "
                         f"class {CLASS_NAME} with load(self, folder) and predict(self, inputs)")
    raise ModelError(f"{path} defines several classes with predict ("
                     f"{', '.join(sorted(c.__name__ for c in own))}); name the one to serve "
                     f"{CLASS_NAME}")


def instantiate(folder: Path) -> tuple[Any, types.ModuleType]:
    """Import the model, make its object and call ``load(folder)``: ready to ``predict``."""
    module = import_model(folder)
    try:
        cls = model_class(module, folder)
        try:
            model = cls()
            load = getattr(model, "load", None)
            if callable(load):
                load(folder)
        except Exception as exc:  # noqa: BLE001 - the user's load may raise anything
            raise ModelError(f"{folder / ENTRY_FILE}: loading the model failed: "
                             f"{describe_failure(exc, folder)}",
                             traceback=user_traceback(exc, folder)) from None
    except BaseException:
        forget(module)
        raise
    return model, module


# ---------------------------------------------------------------------- signature
def declared_signature(cls: type, origin: str) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """The class's ``inputs`` and ``outputs`` attributes as tensor specs; None when it declares
    neither."""
    inputs, outputs = getattr(cls, "inputs", None), getattr(cls, "outputs", None)
    if inputs is None and outputs is None:
        return None
    if inputs is None or outputs is None:
        raise InvalidInput(f"{origin}: class {cls.__name__} declares "
                           f"{'outputs' if inputs is None else 'inputs'} but not "
                           f"{'inputs' if inputs is None else 'outputs'}; declare both")
    return parse_specs(inputs, f"{origin}: inputs"), parse_specs(outputs, f"{origin}: outputs")


def parse_specs(value: Any, origin: str) -> list[TensorSpec]:
    """Tensor specs from ``{"name": ("FP32", [-1, 16])}``, ``{"name": {"datatype", "shape"}}``
    or ``[{"name", "datatype", "shape"}]``; the first dimension must be -1 (rows first)."""
    if isinstance(value, dict):
        items = []
        for name, spec in value.items():
            if isinstance(spec, dict):
                items.append((name, spec.get("datatype"), spec.get("shape")))
            elif isinstance(spec, list | tuple) and len(spec) == 2:
                items.append((name, spec[0], spec[1]))
            else:
                raise InvalidInput(f"{origin}: '{name}' must be (datatype, shape), such as "
                                   "('FP32', [-1, 16])")
    elif isinstance(value, list | tuple):
        items = []
        for spec in value:
            if isinstance(spec, TensorSpec):
                items.append((spec.name, spec.datatype, spec.shape))
            elif isinstance(spec, dict) and "name" in spec:
                items.append((spec["name"], spec.get("datatype"), spec.get("shape")))
            else:
                raise InvalidInput(f"{origin}: each entry must be a mapping with name, "
                                   "datatype and shape")
    else:
        raise InvalidInput(f"{origin} must map each tensor name to (datatype, shape), such as "
                           "{'INPUT0': ('FP32', [-1, 16])}")
    if not items:
        raise InvalidInput(f"{origin} is empty: declare at least one tensor")
    specs = [TensorSpec(str(name), _datatype(datatype, f"{origin}: '{name}'"),
                        _shape(shape, f"{origin}: '{name}'")) for name, datatype, shape in items]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InvalidInput(f"{origin} names a tensor twice: {names}")
    return specs


def _datatype(value: Any, origin: str) -> str:
    if isinstance(value, str) and value.upper() in V2_TO_NUMPY:
        return value.upper()
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is not None and dtype in NUMPY_TO_V2:
        return NUMPY_TO_V2[dtype]
    raise InvalidInput(f"{origin}: datatype {value!r} is not one of {', '.join(V2_TO_NUMPY)} "
                       "(or a numpy dtype such as 'float32')")


def _shape(value: Any, origin: str) -> list[int]:
    if not isinstance(value, list | tuple) or not value:
        raise InvalidInput(f"{origin}: shape must be a list such as [-1, 16] (-1: any size; "
                           "the first dimension is the rows)")
    dims = [-1 if d is None else d for d in value]
    if not all(isinstance(d, int) and not isinstance(d, bool) and (d == -1 or d > 0)
               for d in dims):
        raise InvalidInput(f"{origin}: shape {list(value)} must hold positive sizes or -1")
    if dims[0] != -1:
        raise InvalidInput(f"{origin}: shape {list(value)} must start with -1: the first "
                           "dimension is the rows, any number of them (rows first)")
    return [int(d) for d in dims]
