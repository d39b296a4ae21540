"""Pruning: remove whole hidden units so dense kernels really shrink (structured), and zero
the smallest weights (unstructured magnitude pruning), which is measured and reported honestly:
ONNX Runtime has no sparse kernels, so zeros in a dense matrix cost exactly as much as weights.

Three entry points share one unit-scoring rule (a unit's incoming norm times its outgoing norm):
registered ONNX MLPs (``structured_candidates``), scikit-learn ``MLPClassifier``/``MLPRegressor``
(``prune_sklearn_mlp``) and PyTorch ``nn.Sequential`` stacks of ``Linear`` layers
(``prune_torch_sequential``, torch imported lazily).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx

from redline.errors import InvalidInput
from redline.optimize.candidates import Candidate, Skipped, TuneContext
from redline.optimize.dense import DenseChain, chain_input, find_dense_chain
from redline.optimize.mlp import DenseNet

STRUCTURED_RATIOS = (0.5, 0.75)
SPARSITIES = (0.5, 0.8)


def unit_scores(w_in: np.ndarray, w_out: np.ndarray) -> np.ndarray:
    """Importance of each hidden unit: norm of its incoming weights times its outgoing ones."""
    return np.linalg.norm(w_in, axis=0) * np.linalg.norm(w_out, axis=1)


def kept_units(w_in: np.ndarray, w_out: np.ndarray, ratio: float) -> np.ndarray:
    n = w_in.shape[1]
    keep = max(1, int(round(n * (1.0 - ratio))))
    return np.sort(np.argsort(unit_scores(w_in, w_out))[::-1][:keep])


def prune_units(net: DenseNet, ratio: float) -> DenseNet:
    """Remove ``ratio`` of the units of every hidden layer, lowest-scoring first."""
    if not 0.0 < ratio < 1.0:
        raise InvalidInput(f"pruning ratio must be between 0 and 1 (exclusive), got {ratio}")
    out = net.copy()
    for i in range(len(out.weights) - 1):
        keep = kept_units(out.weights[i], out.weights[i + 1], ratio)
        out.weights[i] = out.weights[i][:, keep]
        out.biases[i] = out.biases[i][keep]
        out.weights[i + 1] = out.weights[i + 1][keep, :]
    return out


def teacher_target(net: DenseNet, scores: np.ndarray) -> np.ndarray:
    """The original's outputs in the shape of the net's head (binary logistic: one column)."""
    if net.output == "logistic" and scores.shape[1] == 2:
        return scores[:, 1:2]
    return scores


def augment(x: np.ndarray, copies: int, seed: int = 0) -> np.ndarray:
    """More rows near the data: Gaussian jitter and mixup of random pairs, for the teacher to
    label. A student learns the teacher's function from many more points than the split has."""
    if copies <= 0:
        return x
    rng = np.random.default_rng(seed)
    x = np.asarray(x, dtype=np.float64)
    std = x.std(axis=0) + 1e-9
    extra = []
    for c in range(copies):
        if c % 2 == 0:
            extra.append(x + rng.normal(0.0, 0.1, size=x.shape) * std)
        else:
            partner = x[rng.permutation(len(x))]
            lam = rng.uniform(0.0, 1.0, size=(len(x), 1))
            extra.append(lam * x + (1 - lam) * partner)
    return np.concatenate([x, *extra])


def _chain(model: bytes, ctx: TuneContext) -> tuple[DenseChain, np.ndarray, np.ndarray] | str:
    chain = find_dense_chain(onnx.load_from_string(model))
    if chain is None:
        return ("not a plain MLP (a chain of MatMul/Gemm layers with Relu/Tanh/Sigmoid); "
                "structured pruning applies to dense networks — for tree ensembles see 'trees'")
    if len(ctx.x) == 0 or not np.isfinite(ctx.x).all():  # NaN in a fine-tune: NaN weights
        return "no fit rows without NaN or infinite values to fine-tune on"
    x = augment(ctx.x, 1 if ctx.fast else 3, ctx.seed)
    h0 = chain_input(chain, x)
    target = teacher_target(chain.net, ctx.teacher_predict(x).scores)
    gap = float(np.abs(chain.net.forward(h0[:len(ctx.x)]) - target[:len(ctx.x)]).max())
    if not gap <= 1e-3:  # also catches NaN
        return (f"the dense layers found do not reproduce the model's outputs (gap {gap:.3g}); "
                "the graph has operations redline cannot see through")
    return chain, h0, target


def structured_candidates(model: bytes, ctx: TuneContext,
                          ratios: tuple[float, ...] = STRUCTURED_RATIOS
                          ) -> Iterator[Candidate | Skipped]:
    found = _chain(model, ctx)
    if isinstance(found, str):
        yield Skipped("prune", "prune", found)
        return
    chain, h0, target = found
    epochs = 8 if ctx.fast else 30
    for ratio in ratios:
        pruned = prune_units(chain.net, ratio)
        pruned.fit(h0, target, epochs=epochs, seed=ctx.seed)
        yield Candidate(
            f"prune-{int(ratio * 100)}", "prune", chain.with_net(pruned).SerializeToString(),
            n_parameters=pruned.n_parameters,
            recipe={"kind": "structured", "removed_share": ratio,
                    "hidden_before": chain.net.hidden_sizes, "hidden_after": pruned.hidden_sizes,
                    "parameters_before": chain.net.n_parameters,
                    "parameters_after": pruned.n_parameters, "fine_tune_epochs": epochs,
                    "fine_tune_target": "original model's outputs (soft targets)"},
            note=f"hidden {chain.net.hidden_sizes} -> {pruned.hidden_sizes}, fine-tuned",
        )


def magnitude_candidates(model: bytes, ctx: TuneContext,
                         sparsities: tuple[float, ...] = SPARSITIES
                         ) -> Iterator[Candidate | Skipped]:
    found = _chain(model, ctx)
    if isinstance(found, str):
        yield Skipped("magnitude", "prune", found)
        return
    chain, h0, target = found
    epochs = 4 if ctx.fast else 10
    for sparsity in sparsities:
        net = chain.net.copy()
        masks = [(np.abs(w) >= np.quantile(np.abs(w), sparsity)).astype(np.float64)
                 for w in net.weights]
        for w, mask in zip(net.weights, masks, strict=True):
            w *= mask
        net.fit(h0, target, epochs=epochs, seed=ctx.seed, masks=masks)
        nonzero = int(sum(int(m.sum()) + b.size for m, b in zip(masks, net.biases, strict=True)))
        yield Candidate(
            f"magnitude-{int(sparsity * 100)}", "prune", chain.with_net(net).SerializeToString(),
            n_parameters=nonzero,
            recipe={"kind": "unstructured-magnitude", "sparsity": sparsity,
                    "fine_tune_epochs": epochs, "nonzero_parameters": nonzero},
            note="zeros inside the same dense kernels: ONNX Runtime has no sparse MatMul, so "
                 "no speed-up or size gain is expected",
        )


# ----------------------------------------------------------------------- framework models
def prune_sklearn_mlp(model: Any, x: np.ndarray, ratio: float = 0.5, *, y: Any = None,
                      fine_tune_iter: int = 20) -> Any:
    """A copy of a fitted scikit-learn MLP with ``ratio`` of each hidden layer's units removed,
    fine-tuned for ``fine_tune_iter`` epochs with ``warm_start`` when labels ``y`` are given."""
    if not hasattr(model, "coefs_"):
        raise InvalidInput("prune_sklearn_mlp needs a fitted MLPClassifier or MLPRegressor")
    net = DenseNet([np.asarray(w) for w in model.coefs_],
                   [np.asarray(b) for b in model.intercepts_])
    small = prune_units(net, ratio)
    pruned = copy.deepcopy(model)
    pruned.coefs_ = [w.copy() for w in small.weights]
    pruned.intercepts_ = [b.copy() for b in small.biases]
    pruned.hidden_layer_sizes = tuple(small.hidden_sizes)
    if y is not None and fine_tune_iter > 0:
        pruned.set_params(warm_start=True, max_iter=fine_tune_iter, early_stopping=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning: a short fine-tune is the point
            pruned.fit(np.asarray(x), np.asarray(y))
    return pruned


def prune_torch_sequential(module: Any, x: np.ndarray, ratio: float = 0.5, *,
                           epochs: int = 20, learning_rate: float = 1e-3, seed: int = 0) -> Any:
    """A copy of an ``nn.Sequential`` whose hidden ``Linear`` layers lose ``ratio`` of their
    units, fine-tuned to reproduce the original module's outputs on ``x`` (mean squared error)."""
    import torch
    from torch import nn

    if not isinstance(module, nn.Sequential):
        raise InvalidInput("prune_torch_sequential needs an nn.Sequential of Linear layers and "
                           "elementwise activations")
    positions = [i for i, m in enumerate(module) if isinstance(m, nn.Linear)]
    if len(positions) < 2:
        raise InvalidInput("the Sequential needs at least two Linear layers to have hidden units")
    module.eval()
    data = torch.as_tensor(np.asarray(x, dtype=np.float32))
    with torch.no_grad():
        target = module(data)
    pruned = copy.deepcopy(module)
    for a, b in zip(positions[:-1], positions[1:], strict=True):
        first: Any = pruned[a]
        second: Any = pruned[b]
        keep = kept_units(first.weight.detach().numpy().T, second.weight.detach().numpy().T, ratio)
        idx = torch.as_tensor(keep, dtype=torch.long)
        new_first = nn.Linear(first.in_features, len(keep), bias=first.bias is not None)
        new_second = nn.Linear(len(keep), second.out_features, bias=second.bias is not None)
        with torch.no_grad():
            new_first.weight.copy_(first.weight[idx])
            if first.bias is not None:
                new_first.bias.copy_(first.bias[idx])
            new_second.weight.copy_(second.weight[:, idx])
            if second.bias is not None:
                new_second.bias.copy_(second.bias)
        pruned[a], pruned[b] = new_first, new_second
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(pruned.parameters(), lr=learning_rate)
    pruned.train()
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        for start in range(0, len(data), 64):
            idx = order[start:start + 64]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(pruned(data[idx]), target[idx])
            loss.backward()
            optimizer.step()
    pruned.eval()
    return pruned


def parameter_count(model: onnx.ModelProto) -> int:
    """Number of values in the graph's float initializers (what the kernels multiply by)."""
    return int(sum(int(np.prod(i.dims)) for i in model.graph.initializer
                   if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                      onnx.TensorProto.FLOAT16)))
