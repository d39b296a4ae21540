"""The retrieval model: item embeddings whose recency-weighted sum over a session is the query.

An item's vector is its own plus its category's (so rarely clicked items still land near their
category); the query of a session is ``sum(RECENCY**i * vector(item_i))`` over its last
``SESSION_ITEMS`` items, most recent first, which is what the inference graph computes from
``items.npy`` when it has no encoder. Trained with PyTorch on (session so far -> next click)
with a full softmax over the catalogue, so every item is a negative.
"""

from __future__ import annotations

import numpy as np

SESSION_ITEMS = 10
RECENCY = 0.8
DIM = 32
TORCH_HELP = ("this example trains its item embeddings with PyTorch, which `make demo` does not "
              "install: run `pip install -e '.[torch]'` in the repository's root (its environment "
              "active), then run it again")


def _import_torch():  # noqa: ANN202 - the torch module, imported lazily
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise  # a broken PyTorch install: its own error says more
        raise ModuleNotFoundError(TORCH_HELP, name="torch") from None
    return torch


def require_torch() -> None:
    """Stop with one line saying how to install PyTorch, before any work, when it is missing."""
    try:
        _import_torch()
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise SystemExit(f"error: {exc}") from None


def _torch_model(category: np.ndarray):  # noqa: ANN202 - torch is imported lazily
    torch = _import_torch()
    from torch import nn

    n_items = len(category)

    class Towers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.items = nn.Embedding(n_items + 1, DIM, padding_idx=n_items)
            nn.init.normal_(self.items.weight, std=0.05)
            self.category = torch.from_numpy(np.append(category, category.max() + 1))
            self.categories = nn.Embedding(int(category.max()) + 2, DIM)
            nn.init.normal_(self.categories.weight, std=0.05)
            self.weights = torch.tensor(RECENCY ** np.arange(SESSION_ITEMS), dtype=torch.float32)

        def item_matrix(self):  # noqa: ANN202
            rows = self.items.weight + self.categories(self.category)
            rows = torch.cat([rows[:n_items], torch.zeros_like(rows[:1])])  # the pad is zero
            return rows

        def forward(self, session_items):  # noqa: ANN001, ANN202
            rows = self.item_matrix()
            return (rows[session_items] * self.weights[None, :, None]).sum(1), rows[:n_items]

    return Towers()


def train(session_items: np.ndarray, targets: np.ndarray, category: np.ndarray, *,
          epochs: int = 3, batch: int = 1024, seed: int = 0, threads: int = 2) -> np.ndarray:
    """Fit on (session items, padded with the catalogue size) -> next item; ``items.npy``."""
    torch = _import_torch()

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    model = _torch_model(category)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    si = torch.from_numpy(session_items.astype(np.int64))
    tg = torch.from_numpy(targets.astype(np.int64))
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for chunk in np.array_split(rng.permutation(len(tg)), max(1, len(tg) // batch)):
            idx = torch.from_numpy(chunk)
            query, rows = model(si[idx])
            loss = torch.nn.functional.cross_entropy(query @ rows.T, tg[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return model.item_matrix()[: len(category)].numpy().astype(np.float32)


def queries(items: np.ndarray, sessions: list[list[int]]) -> np.ndarray:
    """The graph's query per session (most recent item first): a recency-weighted sum."""
    out = np.zeros((len(sessions), items.shape[1]), dtype=np.float32)
    for row, s in enumerate(sessions):
        kept = s[:SESSION_ITEMS]
        if kept:
            w = (RECENCY ** np.arange(len(kept))).astype(np.float32)
            out[row] = (items[kept] * w[:, None]).sum(axis=0)
    return out


def top_k(queries: np.ndarray, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` item indices and scores by inner product, best first."""
    scores = queries @ items.T
    part = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1)
    top = np.take_along_axis(part, order, 1)
    return top, np.take_along_axis(scores, top, 1)
