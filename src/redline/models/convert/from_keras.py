"""Keras 3 to ONNX: a ``.keras`` file (or a Keras model) as the function ``model.export`` serves.

The model is read as the ``serving_default`` signature Keras writes for TF Serving: inputs named
as the model's ``Input`` layers, outputs ``output_0``, ``output_1``, ... (or the keys of a model
that returns a dict). It then converts as a SavedModel does (``from_tensorflow``), through
TensorFlow, and the parity check runs the Keras model itself on the sample.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from redline.errors import ConversionError
from redline.models.convert.frameworks import import_framework
from redline.models.convert.from_tensorflow import ServingFunction, import_tensorflow


def keras_serving(model: Any) -> ServingFunction:
    """The serving function of a Keras model, or of the ``.keras`` file at ``model``."""
    tf = import_tensorflow()
    keras = import_framework("keras", "tensorflow")
    is_file = isinstance(model, str | os.PathLike)
    source = f"the Keras model {model}" if is_file else f"the Keras model {model.name!r}"
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ConversionError(
            f"Keras runs on its {backend} backend here; redline converts Keras models through "
            "TensorFlow. Set KERAS_BACKEND=tensorflow and add the model again (a .keras file "
            "loads on any backend)."
        )
    if is_file:
        try:
            model = keras.saving.load_model(os.fspath(model), compile=False)
        except Exception as exc:
            raise ConversionError(
                f"cannot load {source}: {str(exc).strip().splitlines()[0]}. Custom layers load "
                "only where their code is imported and registered "
                "(keras.saving.register_keras_serializable)."
            ) from exc
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConversionError(
            f"{source} does not declare its inputs (a subclassed model never called): build it "
            "from keras.Input layers, or call it once on data before saving."
        )
    names = [tensor.name for tensor in inputs]

    def call(*tensors: Any) -> dict[str, Any]:
        # one input is passed bare; several by name, which Keras matches to its Input layers
        given = tensors[0] if len(tensors) == 1 else dict(zip(names, tensors, strict=True))
        return named_outputs(keras, model(given, training=False))

    return ServingFunction(
        call=call,
        inputs=[tf.TensorSpec(t.shape, t.dtype, name=n) for t, n in zip(inputs, names,
                                                                         strict=True)],
        framework="keras",
        framework_version=str(keras.__version__),
        source=source,
        owner=model,
    )


def named_outputs(keras: Any, outputs: Any) -> dict[str, Any]:
    """A model's outputs by the names ``model.export`` gives them in its serving signature."""
    if isinstance(outputs, Mapping):
        return {str(k): v for k, v in outputs.items()}
    return {f"output_{i}": v for i, v in enumerate(keras.tree.flatten(outputs))}
