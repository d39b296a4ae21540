"""Find the chain of dense layers inside an ONNX MLP, read it out and write a changed one back.

Works on the graphs the converters produce (scikit-learn: MatMul+Add+activation; PyTorch:
Gemm+activation or MatMul+Add) without knowing where the model came from. Writing back only
replaces initializers, so every other node (input casts, softmax, the label head) and the output
signature stay exactly as they were.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from redline.optimize.mlp import DenseNet

_HIDDEN = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "logistic"}
_OUTPUT = {"Softmax": "softmax", "Sigmoid": "logistic"}


@dataclass
class DenseLayer:
    node: str  # MatMul or Gemm node name
    weight: str  # initializer name
    bias: str | None
    transposed: bool  # Gemm transB=1 stores [out, in]
    input: str
    output: str  # after the activation, if any
    activation: str | None  # ONNX op type following the layer, if recognised


@dataclass
class DenseChain:
    """The dense layers of ``model``, first to last, and the net they compute."""

    model: onnx.ModelProto
    layers: list[DenseLayer]
    net: DenseNet

    def with_net(self, net: DenseNet) -> onnx.ModelProto:
        """A copy of the model whose dense layers hold ``net``'s weights (sizes may shrink)."""
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        inits = {i.name: i for i in model.graph.initializer}
        for layer, w, b in zip(self.layers, net.weights, net.biases, strict=True):
            old_w = inits[layer.weight]
            weight = (w.T if layer.transposed else w).astype(np.float32)
            old_w.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(weight), layer.weight))
            if layer.bias is not None:
                old_b = inits[layer.bias]
                rank = len(old_b.dims)
                bias = b.astype(np.float32).reshape((1, -1) if rank == 2 else (-1,))
                old_b.CopyFrom(numpy_helper.from_array(bias, layer.bias))
        del model.graph.value_info[:]  # intermediate shapes changed; let ORT infer them again
        return model


def find_dense_chain(model: onnx.ModelProto) -> DenseChain | None:
    """The MLP inside ``model``, or None when the graph is not a plain chain of dense layers."""
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)

    def only_consumer(name: str) -> onnx.NodeProto | None:
        found = consumers.get(name, [])
        return found[0] if len(found) == 1 else None

    layers: list[DenseLayer] = []
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        if node.input[1] not in inits:
            continue
        w = inits[node.input[1]].astype(np.float64)
        if w.ndim != 2:
            return None
        transposed = False
        bias_name: str | None = None
        out = node.output[0]
        if node.op_type == "Gemm":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 \
                    or attrs.get("beta", 1.0) != 1.0:
                return None
            transposed = bool(attrs.get("transB", 0))
            if len(node.input) > 2 and node.input[2]:
                if node.input[2] not in inits:
                    return None
                bias_name = node.input[2]
        else:
            nxt = only_consumer(out)
            if nxt is not None and nxt.op_type == "Add":
                other = [i for i in nxt.input if i != out]
                if len(other) == 1 and other[0] in inits:
                    bias_name, out = other[0], nxt.output[0]
        if transposed:
            w = w.T
        b = inits[bias_name].astype(np.float64).reshape(-1) if bias_name else np.zeros(w.shape[1])
        if b.size != w.shape[1]:
            return None
        act_node = only_consumer(out)
        activation = act_node.op_type if act_node is not None and (
            act_node.op_type in _HIDDEN or act_node.op_type in _OUTPUT) else None
        if activation is not None and act_node is not None:
            out = act_node.output[0]
        layers.append(DenseLayer(node.name, node.input[1], bias_name, transposed, node.input[0],
                                 out, activation))
        weights.append(w)
        biases.append(b)
    if len(layers) < 2:
        return None
    for prev, nxt_layer in zip(layers[:-1], layers[1:], strict=True):
        if nxt_layer.input != prev.output:
            return None  # not a single chain (skip connections, branches, extra ops between)
    hidden = {layer.activation for layer in layers[:-1]}
    if len(hidden) != 1:
        return None
    hidden_op = hidden.pop()
    if layers[-1].activation in ("Relu", "Tanh"):
        return None  # a rectified/tanh output layer is not a head we can train against
    if hidden_op is not None and hidden_op not in _HIDDEN:
        return None
    activation = _HIDDEN.get(hidden_op or "", "identity")
    output = _OUTPUT.get(layers[-1].activation or "", "identity")
    return DenseChain(model, layers, DenseNet(weights, biases, activation, output))


def chain_input(chain: DenseChain, x: np.ndarray) -> np.ndarray:
    """What the first dense layer sees for rows ``x`` (after any scaler or cast before it)."""
    import onnxruntime as ort

    graph = chain.model.graph
    first = chain.layers[0].input
    if first in {i.name for i in graph.input}:
        return np.asarray(x, dtype=np.float64)
    probe = onnx.ModelProto()
    probe.CopyFrom(chain.model)
    probe.graph.output.append(
        onnx.helper.make_tensor_value_info(first, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    feed = {graph.input[0].name: np.asarray(x, dtype=np.float32)}
    return np.asarray(session.run([first], feed)[0], dtype=np.float64)
