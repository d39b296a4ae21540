"""The two-tower retrieval model: item embeddings and a query encoder, trained with PyTorch.

The item tower is a table: one vector per catalogue item plus a popularity bias, saved as the
rows of ``items.npy`` (the bias is the last column, so retrieval is one inner product with a
query whose last value is 1). An item's vector is its own plus its category's (so rarely
clicked items still land near their category), its bias a learned share of its log popularity
plus its own. The query tower reads the session's last ``SESSION_ITEMS`` items (most recent
first; the catalogue size pads) and the user's activity windows, and is exported as an ONNX
encoder; training uses a full softmax over the catalogue, so every item is a negative.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

SESSION_ITEMS = 10
DIM = 32


def _torch_model(n_items: int, n_user: int, category: np.ndarray, popularity: np.ndarray):  # noqa: ANN202 - torch is imported lazily
    import torch
    from torch import nn

    class Encoder(nn.Module):
        """Session items (recency-weighted mean of their vectors) + user windows -> query."""

        def __init__(self) -> None:
            super().__init__()
            self.items = nn.Embedding(n_items + 1, DIM, padding_idx=n_items)
            nn.init.normal_(self.items.weight, std=0.05)
            with torch.no_grad():
                self.items.weight[n_items].zero_()
            self.category = torch.from_numpy(np.append(category, category.max() + 1))
            self.categories = nn.Embedding(int(category.max()) + 2, DIM)
            nn.init.normal_(self.categories.weight, std=0.05)
            self.log_pop = torch.from_numpy(np.log(np.append(popularity, 1.0)).astype(np.float32))
            self.pop_weight = nn.Parameter(torch.tensor(0.5))
            self.bias = nn.Parameter(torch.zeros(n_items + 1))
            self.recency = nn.Parameter(torch.linspace(1.0, 0.3, SESSION_ITEMS))
            self.mlp = nn.Sequential(nn.Linear(DIM + n_user, 64), nn.ReLU(), nn.Linear(64, DIM))
            self.n_items = n_items

        def forward(self, session_items, user_features):  # noqa: ANN001, ANN202
            present = (session_items != self.n_items).float()
            weight = present * self.recency
            vectors = self.items(session_items) + self.categories(self.category[session_items])
            pooled = (vectors * weight.unsqueeze(-1)).sum(1)
            pooled = pooled / weight.sum(1, keepdim=True).clamp(min=1e-6)
            x = torch.cat([pooled, torch.log1p(user_features.clamp(min=0.0))], dim=1)
            query = self.mlp(x) + pooled
            return torch.cat([query, torch.ones_like(query[:, :1])], dim=1)

        def item_matrix(self):  # noqa: ANN202
            vectors = self.items.weight + self.categories(self.category)
            bias = self.bias + self.pop_weight * self.log_pop
            rows = torch.cat([vectors, bias.unsqueeze(1)], dim=1)
            return rows[: self.n_items]

    return Encoder()


def train(session_items: np.ndarray, user_features: np.ndarray, targets: np.ndarray,
          category: np.ndarray, popularity: np.ndarray, *, epochs: int = 3, batch: int = 1024,
          seed: int = 0,
          threads: int = 2) -> tuple[np.ndarray, bytes]:
    """Fit on (session items, user windows) -> next item; returns ``items.npy`` rows and the
    encoder as ONNX bytes (inputs ``session_items`` int64 [n, 10], ``user_features`` float32
    [n, u]; output ``query`` float32 [n, 33])."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    n_items = len(category)
    model = _torch_model(n_items, user_features.shape[1], category, popularity)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    si = torch.from_numpy(session_items.astype(np.int64))
    uf = torch.from_numpy(user_features.astype(np.float32))
    tg = torch.from_numpy(targets.astype(np.int64))
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for chunk in np.array_split(rng.permutation(len(tg)), max(1, len(tg) // batch)):
            idx = torch.from_numpy(chunk)
            query = model(si[idx], uf[idx])
            logits = query @ model.item_matrix().T
            loss = torch.nn.functional.cross_entropy(logits, tg[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        items = model.item_matrix().numpy().astype(np.float32)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (si[:2], uf[:2]), buf, dynamo=False,
                          input_names=["session_items", "user_features"],
                          output_names=["query"],
                          dynamic_axes={"session_items": {0: "batch"},
                                        "user_features": {0: "batch"}, "query": {0: "batch"}})
    return items, buf.getvalue()


class Encoder:
    """The exported encoder run by ONNX Runtime (what the server runs)."""

    def __init__(self, onnx_bytes: bytes) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(onnx_bytes, opts,
                                            providers=["CPUExecutionProvider"])

    def __call__(self, session_items: np.ndarray, user_features: np.ndarray) -> np.ndarray:
        return self.session.run(["query"], {
            "session_items": session_items.astype(np.int64),
            "user_features": user_features.astype(np.float32)})[0]


def top_k(queries: np.ndarray, items: np.ndarray, k: int, exclude: list[set[int]]) -> np.ndarray:
    """Exact top-``k`` item indices by inner product, best first, without the excluded ones."""
    scores = queries @ items.T
    for row, seen in enumerate(exclude):
        if seen:
            scores[row, list(seen)] = -np.inf
    part = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1)
    return np.take_along_axis(part, order, 1)
