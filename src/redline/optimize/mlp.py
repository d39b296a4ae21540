"""A dense network in numpy: forward, backward and Adam, for fine-tuning and distillation.

Pruned MLPs need a short fine-tune and students need training, both against a teacher's outputs
(soft targets). Doing it in numpy keeps ``redline optimize`` free of a training framework: the
networks involved are a few hundred units wide and train in seconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HIDDEN_ACTIVATIONS = ("relu", "tanh", "logistic", "identity")
# Output heads: softmax (multi-class probabilities), logistic (one-column binary probability),
# identity (regression values or raw logits).
OUTPUT_ACTIVATIONS = ("softmax", "logistic", "identity")


@dataclass
class DenseNet:
    """``weights[i]`` is ``[in, out]``; hidden layers share ``activation``, the last ``output``."""

    weights: list[np.ndarray]
    biases: list[np.ndarray]
    activation: str = "relu"
    output: str = "identity"
    history: list[float] = field(default_factory=list)

    @property
    def hidden_sizes(self) -> list[int]:
        return [w.shape[1] for w in self.weights[:-1]]

    @property
    def n_parameters(self) -> int:
        return int(sum(w.size + b.size for w, b in zip(self.weights, self.biases, strict=True)))

    def copy(self) -> DenseNet:
        return DenseNet([w.copy() for w in self.weights], [b.copy() for b in self.biases],
                        self.activation, self.output)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self._forward(np.asarray(x, dtype=np.float64))[-1]

    def _forward(self, x: np.ndarray) -> list[np.ndarray]:
        acts = [x]
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            z = acts[-1] @ w + b
            acts.append(_activate(z, self.output if i == last else self.activation))
        return acts

    def fit(self, x: np.ndarray, target: np.ndarray, *, epochs: int = 30, batch_size: int = 64,
            learning_rate: float = 1e-3, l2: float = 1e-5, seed: int = 0,
            masks: list[np.ndarray] | None = None) -> DenseNet:
        """Adam on soft targets: cross-entropy for softmax/logistic heads, squared error else.

        ``masks`` (same shapes as ``weights``) keep pruned weights at zero while training.
        """
        x = np.asarray(x, dtype=np.float64)
        target = np.asarray(target, dtype=np.float64).reshape(len(x), -1)
        rng = np.random.default_rng(seed)
        params = [*self.weights, *self.biases]
        m = [np.zeros_like(p) for p in params]
        v = [np.zeros_like(p) for p in params]
        step = 0
        n_layers = len(self.weights)
        for _ in range(epochs):
            order = rng.permutation(len(x))
            total = 0.0
            for start in range(0, len(x), batch_size):
                idx = order[start:start + batch_size]
                acts = self._forward(x[idx])
                out, t = acts[-1], target[idx]
                total += _loss(out, t, self.output) * len(idx)
                # For softmax+CE, logistic+BCE and identity+MSE the output gradient is out - t.
                delta = (out - t) / len(idx)
                grads_w: list[np.ndarray] = [np.empty(0)] * n_layers
                grads_b: list[np.ndarray] = [np.empty(0)] * n_layers
                for i in range(n_layers - 1, -1, -1):
                    grads_w[i] = acts[i].T @ delta + l2 * self.weights[i]
                    grads_b[i] = delta.sum(axis=0)
                    if i:
                        delta = (delta @ self.weights[i].T) * _derivative(acts[i], self.activation)
                step += 1
                for j, (p, g) in enumerate(zip(params, [*grads_w, *grads_b], strict=True)):
                    m[j] = 0.9 * m[j] + 0.1 * g
                    v[j] = 0.999 * v[j] + 0.001 * g * g
                    m_hat = m[j] / (1 - 0.9 ** step)
                    v_hat = v[j] / (1 - 0.999 ** step)
                    p -= learning_rate * m_hat / (np.sqrt(v_hat) + 1e-8)
                if masks is not None:
                    for w, mask in zip(self.weights, masks, strict=True):
                        w *= mask
            self.history.append(total / len(x))
        return self


def _activate(z: np.ndarray, kind: str) -> np.ndarray:
    if kind == "relu":
        return np.maximum(z, 0.0)
    if kind == "tanh":
        return np.tanh(z)
    if kind == "logistic":
        return 1.0 / (1.0 + np.exp(-np.clip(z, -500, 500)))
    if kind == "softmax":
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    return z


def _derivative(a: np.ndarray, kind: str) -> np.ndarray:
    """Derivative of the activation written in terms of its output ``a``."""
    if kind == "relu":
        return (a > 0).astype(a.dtype)
    if kind == "tanh":
        return 1.0 - a * a
    if kind == "logistic":
        return a * (1.0 - a)
    return np.ones_like(a)


def _loss(out: np.ndarray, t: np.ndarray, kind: str) -> float:
    eps = 1e-12
    if kind == "softmax":
        return float(-(t * np.log(out + eps)).sum(axis=1).mean())
    if kind == "logistic":
        return float(-(t * np.log(out + eps) + (1 - t) * np.log(1 - out + eps)).mean())
    return float(((out - t) ** 2).mean())


def standardize_first_layer(net: DenseNet, mean: np.ndarray, scale: np.ndarray) -> DenseNet:
    """Fold ``(x - mean) / scale`` into the first layer so the net takes raw inputs."""
    w0 = net.weights[0] / scale[:, None]
    b0 = net.biases[0] - mean @ w0
    out = net.copy()
    out.weights[0], out.biases[0] = w0, b0
    return out


def new_net(sizes: list[int], activation: str, output: str, seed: int = 0) -> DenseNet:
    """Glorot-initialised net with layer sizes ``[n_in, hidden..., n_out]``."""
    rng = np.random.default_rng(seed)
    weights, biases = [], []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        bound = np.sqrt(6.0 / (n_in + n_out))
        weights.append(rng.uniform(-bound, bound, size=(n_in, n_out)))
        biases.append(np.zeros(n_out))
    return DenseNet(weights, biases, activation, output)
