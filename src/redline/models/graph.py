"""Inference graphs: a model version declared as steps (``graph.yaml``), checked at ``add``.

A graph folder holds ``graph.yaml``, the item embeddings ``items.npy`` (float32, one row per
item), the item table ``items.parquet`` (an ``item_id`` column, then numeric columns the rank
and rules steps read), the ranking model (ONNX) and, optionally, a query encoder (ONNX). At
``models add`` everything is checked (an empty catalogue, an embedding of the wrong dimension or
a K above the catalogue size are refused with the fix), an ANN index is built for large
catalogues and its recall@K against exact search is measured and recorded. The format is
documented in ``docs/recommend.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from redline.errors import InvalidInput, MissingDependency

GRAPH_FILE = "graph.yaml"
ITEMS_NPY = "items.npy"
ITEMS_TABLE = "items.parquet"
INDEX_FILE = "items.faiss"
ENCODER_FILE = "encoder.onnx"
STEP_NAMES = ("features", "encode", "retrieve", "rank", "rules")
# Catalogues at least this large get an ANN index unless the graph says ``index: exact``: below
# it exact search costs about as much (docs/performance.md) and its recall is 1.
ANN_MIN_ITEMS = 100_000
_RANK_SOURCES = ("retrieval", "item", "field", "session", "entity")


@dataclass
class GraphSpec:
    """A checked ``graph.yaml``: what each step does (see ``docs/recommend.md``)."""

    session_items: int = 20
    fields: list[str] = field(default_factory=list)
    entity_features: list[str] = field(default_factory=list)  # "view:feature" refs
    encoder: str | None = None
    k: int = 100
    index: str = "auto"           # auto | exact | hnsw
    hnsw_m: int = 32
    ef_search: int = 128
    ranker: str = "ranker.onnx"
    rank_features: list[str] = field(default_factory=list)
    drop_seen: bool = True
    in_stock: str | None = None   # an item column; 0 means out of stock
    top_n: int = 10

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GraphSpec:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def parse_graph(doc: Any, origin: str = GRAPH_FILE) -> GraphSpec:
    """``graph.yaml``'s document as a :class:`GraphSpec`; any mistake is an ``InvalidInput``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise InvalidInput(f"{origin} must be a mapping with a 'steps' list (features, encode, "
                           "retrieve, rank, rules), see docs/recommend.md")
    spec = GraphSpec()
    seen: list[str] = []
    for i, step in enumerate(doc["steps"]):
        if not isinstance(step, dict) or len(step) != 1:
            raise InvalidInput(f"{origin}: steps[{i}] must be one mapping like "
                               "'retrieve: {k: 100}'")
        (name, opts), = step.items()
        if name not in STEP_NAMES:
            raise InvalidInput(f"{origin}: unknown step '{name}' (steps: {', '.join(STEP_NAMES)})")
        if name in seen:
            raise InvalidInput(f"{origin}: step '{name}' is declared twice")
        seen.append(name)
        opts = opts or {}
        if not isinstance(opts, dict):
            raise InvalidInput(f"{origin}: step '{name}' takes a mapping of options")
        _apply(spec, name, opts, origin)
    order = [s for s in STEP_NAMES if s in seen]
    if seen != order:
        raise InvalidInput(f"{origin}: steps must come in the order {', '.join(order)}")
    for required in ("retrieve", "rank"):
        if required not in seen:
            raise InvalidInput(f"{origin}: a graph needs a '{required}' step")
    if "output" in doc:
        out = doc["output"] or {}
        spec.top_n = _positive(out.get("top_n", spec.top_n), "output.top_n", origin)
    if spec.top_n > spec.k:
        raise InvalidInput(f"{origin}: output.top_n ({spec.top_n}) is larger than retrieve.k "
                           f"({spec.k}); lower top_n or raise k")
    return spec


def _apply(spec: GraphSpec, name: str, opts: dict[str, Any], origin: str) -> None:
    where = f"{origin}: step '{name}'"
    if name == "features":
        spec.session_items = _positive(opts.get("session_items", spec.session_items),
                                       f"{name}.session_items", origin)
        spec.fields = _names(opts.get("fields", []), f"{where}.fields")
        spec.entity_features = _names(opts.get("entity", []), f"{where}.entity")
        for ref in spec.entity_features:
            if ":" not in ref:
                raise InvalidInput(f"{where}.entity: {ref!r} must be 'view:feature'")
    elif name == "encode":
        spec.encoder = str(opts.get("model", ENCODER_FILE))
    elif name == "retrieve":
        spec.k = _positive(opts.get("k", spec.k), "retrieve.k", origin)
        spec.index = str(opts.get("index", spec.index))
        if spec.index not in ("auto", "exact", "hnsw"):
            raise InvalidInput(f"{where}: index must be auto, exact or hnsw, got {spec.index!r}")
        spec.hnsw_m = _positive(opts.get("hnsw_m", spec.hnsw_m), "retrieve.hnsw_m", origin)
        spec.ef_search = _positive(opts.get("ef_search", spec.ef_search), "retrieve.ef_search",
                                   origin)
    elif name == "rank":
        spec.ranker = str(opts.get("model", spec.ranker))
        spec.rank_features = _names(opts.get("features", []), f"{where}.features")
        if not spec.rank_features:
            raise InvalidInput(f"{where} needs 'features': the ranker's input columns in order")
        for f in spec.rank_features:
            source = f.split(":", 1)[0]
            if source not in _RANK_SOURCES or (source != "retrieval" and ":" not in f):
                raise InvalidInput(
                    f"{where}: feature {f!r} must be retrieval:score, retrieval:position, "
                    "item:<column>, field:<request field>, entity:<view:feature> or "
                    "session:length/seen/clicks")
    elif name == "rules":
        spec.drop_seen = bool(opts.get("drop_seen", True))
        stock = opts.get("in_stock")
        spec.in_stock = str(stock) if stock else None


def rank_sample(spec: GraphSpec, cat: Catalogue, rows: int = 16) -> np.ndarray:
    """Rows of the rank features a Python ranker is checked on at ``add``: the first items'
    columns, their retrieval scores against the catalogue's mean and their positions; zeros for
    what only a request has (fields, entity features, the session)."""
    n = min(rows, cat.size)
    x = np.zeros((n, len(spec.rank_features)), dtype=np.float32)
    for j, ref in enumerate(spec.rank_features):
        source, _, what = ref.partition(":")
        if source == "item" and what in cat.columns:
            x[:, j] = cat.columns[what][:n]
        elif ref == "retrieval:score":
            x[:, j] = cat.embeddings[:n] @ cat.embeddings.mean(axis=0)
        elif ref == "retrieval:position":
            x[:, j] = np.arange(n)
    return x


def _positive(value: Any, what: str, origin: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{origin}: {what} must be a positive whole number, got {value!r}")
    return value


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{what} must be a list of names")
    return list(value)


@dataclass
class Catalogue:
    """The items a graph retrieves from: ids, embeddings and numeric columns."""

    ids: list[str]
    embeddings: np.ndarray                        # (items, dim) float32, C-contiguous
    columns: dict[str, np.ndarray]                # name -> (items,) float32
    max_norm: float                               # the largest embedding norm (exact_top_k_rows)

    @property
    def size(self) -> int:
        return len(self.ids)


def load_catalogue(folder: Path) -> Catalogue:
    """Read and check ``items.npy`` and ``items.parquet`` (same row count, finite values)."""
    npy, table = folder / ITEMS_NPY, folder / ITEMS_TABLE
    for path in (npy, table):
        if not path.is_file():
            raise InvalidInput(f"a graph needs {path.name} next to {GRAPH_FILE} (missing: "
                               f"{path})")
    try:
        emb = np.load(npy, allow_pickle=False)
    except ValueError as exc:
        raise InvalidInput(f"{npy} is not a numpy array file ({exc})") from exc
    if emb.ndim != 2 or emb.dtype.kind != "f":
        raise InvalidInput(f"{npy} must be a 2-D float array (items x dim), got shape "
                           f"{emb.shape} of {emb.dtype}")
    if emb.shape[0] == 0:
        raise InvalidInput(f"the catalogue is empty: {npy} has no rows; export at least one "
                           "item embedding")
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if not np.isfinite(emb).all():
        raise InvalidInput(f"{npy} holds NaN or infinite values")
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependency("graphs need pyarrow and faiss-cpu: pip install "
                                "'redline[ann]'") from exc
    data = pq.read_table(table)
    if "item_id" not in data.column_names:
        raise InvalidInput(f"{table} needs an 'item_id' column (then numeric item columns)")
    ids = [str(v) for v in data.column("item_id").to_pylist()]
    if len(ids) != emb.shape[0]:
        raise InvalidInput(f"{table} has {len(ids)} items but {npy} has {emb.shape[0]} "
                           "embeddings: they must list the same items in the same order")
    if len(set(ids)) != len(ids):
        raise InvalidInput(f"{table}: item_id values must be unique")
    columns: dict[str, np.ndarray] = {}
    for name in data.column_names:
        if name == "item_id":
            continue
        col = data.column(name).to_numpy(zero_copy_only=False)
        if col.dtype.kind in "fiub":
            columns[name] = np.nan_to_num(col.astype(np.float32))
    return Catalogue(ids, emb, columns, max_row_norm(emb))  # at load, not on a first request


def check_graph(spec: GraphSpec, cat: Catalogue, folder: Path, origin: str) -> int:
    """Check the spec against its catalogue and models; the query dimension."""
    dim = cat.embeddings.shape[1]
    if spec.k > cat.size:
        raise InvalidInput(f"{origin}: retrieve.k ({spec.k}) is larger than the catalogue "
                           f"({cat.size} items); lower k to at most {cat.size}")
    for f in spec.rank_features:
        source, _, what = f.partition(":")
        if source == "item" and what not in cat.columns:
            raise InvalidInput(f"{origin}: rank feature {f!r} names no numeric column of "
                               f"{ITEMS_TABLE} (columns: {sorted(cat.columns)})")
        if source == "field" and what not in spec.fields:
            raise InvalidInput(f"{origin}: rank feature {f!r} needs '{what}' in "
                               "features.fields")
        if source == "entity" and what not in spec.entity_features:
            raise InvalidInput(f"{origin}: rank feature {f!r} needs '{what}' in "
                               "features.entity")
    if spec.in_stock is not None and spec.in_stock not in cat.columns:
        raise InvalidInput(f"{origin}: rules.in_stock names no column of {ITEMS_TABLE} "
                           f"(columns: {sorted(cat.columns)})")
    if spec.encoder is not None:
        from redline.models.onnxfile import inspect_onnx

        path = folder / spec.encoder
        if not path.is_file():
            raise InvalidInput(f"{origin}: the encode step's model {path} does not exist")
        inputs, outputs = inspect_onnx(path.read_bytes(), str(path))
        width = inputs[0].shape[-1] if inputs and inputs[0].shape else -1
        if len(inputs) != 1 or width not in (-1, len(spec.fields)):
            raise InvalidInput(f"{origin}: the encoder must take one input of "
                               f"{len(spec.fields)} columns (features.fields), got "
                               f"{[(i.name, i.shape) for i in inputs]}")
        out = outputs[0].shape[-1] if outputs and outputs[0].shape else -1
        if out not in (-1, dim):
            raise InvalidInput(f"{origin}: the encoder's output has {out} columns but "
                               f"{ITEMS_NPY} has dimension {dim}: they must match")
    return dim


def uses_ann(spec: GraphSpec, size: int) -> bool:
    return spec.index == "hnsw" or (spec.index == "auto" and size >= ANN_MIN_ITEMS)


def build_index(cat: Catalogue, spec: GraphSpec) -> Any:
    """An HNSW inner-product index over the embeddings (FAISS)."""
    try:
        import faiss
    except ImportError as exc:
        raise MissingDependency("an ANN index needs faiss-cpu: pip install 'redline[ann]' "
                                "(or set retrieve.index: exact)") from exc
    index = faiss.IndexHNSWFlat(cat.embeddings.shape[1], spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = max(64, 2 * spec.hnsw_m)
    index.add(cat.embeddings)
    index.hnsw.efSearch = max(spec.ef_search, spec.k)
    return index


# Items per group when the top-k looks for its threshold (see exact_top_k_rows): smaller groups
# leave fewer candidates to partition (0.88x the time of 64 for a lone query's top-100 of
# 50,000: benchmarks/pipeline/retrieval_kernels.py).
TOP_K_GROUP = 16
# How far, in units of the rounding bound, a BLAS score may sit from its exact score before the
# search could miss an item (twice the bound: a margin for a BLAS that rounds less carefully).
SCORE_SLACK = 2.0
# Queries from which a batch's scores are one matrix product rather than one product a query.
PRODUCT_MIN = 4


def exact_scores(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The score a search returns for each of ``rows`` [m, dim] against ``query`` [dim]:
    float32 products summed along each row by numpy, row by row, so a row's score has the same
    bits whatever other rows are scored with it (a BLAS product's last bit depends on its
    shape: OpenBLAS sums an eight-query product differently from a one-query one)."""
    return (rows * query).sum(axis=1, dtype=np.float32)


def max_row_norm(emb: np.ndarray) -> float:
    """The largest row norm of ``emb``: with a query's norm, it bounds how far a BLAS score can
    be from :func:`exact_scores` (:func:`exact_top_k_rows`)."""
    return float(np.sqrt(np.einsum("ij,ij->i", emb, emb, dtype=np.float64).max()))


def exact_top_k_rows(emb: np.ndarray, queries: np.ndarray, k: int,
                     max_norm: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` rows of ``emb`` [items, dim] by inner product with each row of
    ``queries`` [n, dim]: (rows [n, k] int64, scores [n, k] float32), best first, equal scores
    in row order; ``max_norm``: ``max_row_norm(emb)``, computed when not given.

    A batch's scores are one matrix product (the catalogue read once for all its queries; one
    matrix-vector product a query below ``PRODUCT_MIN`` queries), yet
    a query's answer does not depend on its company, bit for bit: the product only narrows the
    search. Its scores differ from :func:`exact_scores` by at most the float32 rounding bound
    of a ``dim``-long sum (``dim * 2**-24 * |query| * max_norm`` for each of the two), so every
    item within twice that of the product's k-th score is scored again exactly, and the top-k
    is taken from those exact scores -- the same for a query alone or in any batch. Finding the
    product's k-th score is cheap: the items are cut into groups of ``TOP_K_GROUP``, the k
    largest group maxima bound it from below, and only the groups that reach the bound (about
    k of them) are partitioned, not the whole catalogue.
    """
    n, items = queries.shape[0], emb.shape[0]
    dim = emb.shape[1]
    k = min(k, items)
    if max_norm is None:
        max_norm = max_row_norm(emb)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    # items x n: OpenBLAS's product this way round was the faster; below PRODUCT_MIN queries
    # a matrix-vector product each costs less (benchmarks/pipeline/retrieval_kernels.py)
    products = emb @ queries.T if n >= PRODUCT_MIN else None
    rounding = dim * 2.0 ** -24 / (1 - dim * 2.0 ** -24)
    width = items // TOP_K_GROUP  # group g: items g, g + width, g + 2 width, ... (and the tail)
    out_rows = np.empty((n, k), dtype=np.int64)
    out_scores = np.empty((n, k), dtype=np.float32)
    members = np.arange(TOP_K_GROUP, dtype=np.int64) * width
    for j in range(n):
        query = queries[j]
        row = products[:, j] if products is not None else emb @ query
        margin = 2 * SCORE_SLACK * rounding * float(np.linalg.norm(query)) * max_norm
        if width > k and np.isfinite(margin):
            maxima = row[:width * TOP_K_GROUP].reshape(TOP_K_GROUP, width).max(axis=0)
            bound = np.partition(maxima, width - k)[width - k] - margin
            candidates = (np.flatnonzero(maxima >= bound)[:, None] + members).ravel()
            tail = np.arange(width * TOP_K_GROUP, items, dtype=np.int64)
            candidates = np.concatenate([candidates, tail[row[tail] >= bound]])
            values = row[candidates]
            kth = np.partition(values, len(values) - k)[len(values) - k]
            candidates = candidates[values >= kth - margin]
        else:  # a small catalogue (or a query of infinite norm): every item, exactly
            candidates = np.arange(items, dtype=np.int64)
        scores = exact_scores(emb[candidates], query)
        order = np.lexsort((candidates, -scores))[:k]  # best first; ties: the lower row
        out_rows[j] = candidates[order]
        out_scores[j] = scores[order]
    return out_rows, out_scores


def measure_recall(index: Any, cat: Catalogue, k: int, queries: int = 200,
                   seed: int = 0) -> float:
    """Recall@k of ``index`` against exact search, over queries drawn near catalogue items."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(cat.size, size=min(queries, cat.size), replace=False)
    q = cat.embeddings[rows] + rng.normal(0, 0.1, size=(len(rows), cat.embeddings.shape[1])
                                          ).astype(np.float32) * cat.embeddings.std()
    q = np.ascontiguousarray(q, dtype=np.float32)
    _, found = index.search(q, k)
    exact, _ = exact_top_k_rows(cat.embeddings, q, k, cat.max_norm)
    hits = 0
    for i in range(len(rows)):
        hits += len(set(exact[i].tolist()) & set(found[i].tolist()))
    return hits / (len(rows) * k)
