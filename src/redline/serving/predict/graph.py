"""Serving an inference graph (``graph.yaml``): session items, query, retrieve, rank, rules.

Loaded once per model version (the catalogue, the ANN index, the encoder: :class:`GraphRunner`,
here), then each request (``graph_request.run_graph``):

1. **sessions** — the session's last items (``PredictPipeline.session_items``); none for an
   unknown session (a cold start) or when the store is down (then the answer says so).
2. **query** — the encoder's query vector from the request fields, else the recency-weighted mean
   of the session items' embeddings; with neither, the catalogue's ``popularity`` order.
3. **retrieve** — top-K by inner product: exact (numpy) or the HNSW index built at ``add``.
   When the budget left is below the recent p99 of query and retrieval together, both are
   skipped and the candidates are the catalogue's ``popularity`` order, ``degraded`` with the
   reason.
4. **rank** — the K candidates' rows in one batched run of the ranking model (its run is the
   queue/inference stages). When the budget left is below the ranker's recent p99, or the run
   is refused or late, the answer is the retrieval order, ``degraded`` with the reason.
5. **rules** — drop the items already seen in the session and those out of stock; top-N.

Across requests: requests that reach retrieval together are one search (their query vectors
one [n, dim] matrix: a scoring and a top-K per row, or one HNSW search of the matrix),
and requests that reach ranking together are one ranker run over all their candidates
([sum K, features]). Both go through the dynamic batcher (``serving/batcher.py``): retrieval
through the runner's own, ranking through the ranker version's, whose batches hold up to
``max_batch_size`` requests of K rows. A request that reaches retrieval while others are still
reading their features and session waits for them, at most the recent p99 of that way
(``GATHER_MAX_S`` at most) and never past what its budget leaves for retrieval and ranking; a
lone request takes the batcher's idle fast path and runs at once; one whose budget cannot wait
for the batch ahead of it runs alone. A query's answer is the same whatever it is batched with,
bit for bit: a batch's product only narrows the search, and the top-K is taken from scores
computed row by row (``models/graph.py``'s ``exact_top_k_rows``).
The entity features and the session items are read at once, over the event loop's one Redis
connection: one round trip.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.config import BatchingSettings
from redline.errors import (
    FeatureNotFound,
    InvalidInput,
    RedlineError,
)
from redline.features.definitions import FeatureDefinitions, FeatureView
from redline.features.online.base import OnlineStore
from redline.models import graph as g
from redline.serving.batcher import Batcher, Inputs, Outputs
from redline.serving.deadline import LOW, Budget
from redline.serving.handle import ModelHandle
from redline.serving.predict.latency import LatencyWindow
from redline.serving.predict.plan import Route
from redline.serving.predict.request import PredictRequest
from redline.serving.predict.sessions import SessionItem
from redline.serving.stages import (
    RequestRecord,
)

if TYPE_CHECKING:
    pass

RETRIEVAL_PATH = "fallback"  # the retrieval order served in place of the ranking
QUERIES = "queries"  # the retrieval batcher's input: [n, dim] query vectors
# A retrieval batch predicted shorter than this runs on the event loop (as one request's search
# always did); a longer one, on the runner's own thread.
RETRIEVE_INLINE_US = 5000
# The longest a request waits at retrieval for the requests on their way there (less when their
# recent way there is shorter, or its budget is tighter).
GATHER_MAX_S = 0.001


class GraphRunner:
    """One loaded graph version: its catalogue, index and encoder, ready for requests."""

    def __init__(self, folder: Path, spec: g.GraphSpec, name: str = "",
                 retrieval: LatencyWindow | None = None,
                 batching: BatchingSettings | None = None) -> None:
        self.name = name
        self.spec = spec
        # the recent p99 of query + retrieve, which the budget is checked against
        self.retrieval = retrieval if retrieval is not None else LatencyWindow(256)
        self.cat = g.load_catalogue(folder)
        self.row_of = {item: i for i, item in enumerate(self.cat.ids)}
        self.index: Any = None
        index_file = folder / g.INDEX_FILE
        if index_file.is_file():
            import faiss

            # One query a request: FAISS's thread pool would only add hand-offs and contention.
            faiss.omp_set_num_threads(1)
            self.index = faiss.read_index(str(index_file))
            self.index.hnsw.efSearch = max(spec.ef_search, spec.k)
        self.encoder: Any = None
        if spec.encoder is not None:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            self.encoder = ort.InferenceSession(str(folder / g.ENCODER_FILE), opts,
                                                providers=["CPUExecutionProvider"])
            self.encoder_input = self.encoder.get_inputs()[0].name
        pop = self.cat.columns.get("popularity")
        order = np.argsort(-pop, kind="stable") if pop is not None else np.arange(self.cat.size)
        self.popular = order[:spec.k]
        self.in_stock = self.cat.columns.get(spec.in_stock) if spec.in_stock else None
        self.route: Route | None = None  # set when the graph reads entity features
        self.entity_col: dict[str, int] = {}
        # Cross-request retrieval: the model's batching settings, its runs on the loop unless
        # long (then on this runner's own thread).
        batching = batching or BatchingSettings()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"retrieve-{name}")
        self.retriever = Batcher(
            self.search, replace(batching, max_queue_delay_us=0, adaptive=False,
                                 inline_max_us=max(batching.inline_max_us, RETRIEVE_INLINE_US)),
            executor=self._pool, name=f"{name}:retrieve")
        self.upstream = 0  # requests in the graph that have not reached retrieval yet
        self.unranked = 0  # requests in the graph that have not reached ranking yet
        # how long requests take from entering the graph to retrieval: what a batch waits for
        self.way_there = LatencyWindow(256)
        self._gate: asyncio.Future[None] | None = None  # requests waiting for the others
        self._gate_timer: asyncio.TimerHandle | None = None
        self._gate_at = math.inf
        self._gathered = 0  # requests between the gate and the retrieval queue

    def batch_ranker(self, handle: ModelHandle) -> None:
        """Size the ranker's batches in requests: up to ``max_batch_size`` requests of K
        candidate rows each run as one (its batcher counts rows)."""
        batcher = handle.batcher
        if batcher.batchable:
            batcher.max_batch = max(1, batcher.settings.max_batch_size) * self.spec.k
            if not batcher.settings.adaptive:
                batcher.cap = batcher.max_batch

    def close(self) -> None:
        """Release the retrieval thread (the version no longer serves)."""
        self._pool.shutdown(wait=False)

    def read_entity(self, store: OnlineStore | None, defs: FeatureDefinitions | None,
                    handle: ModelHandle) -> None:
        """Plan the features step's entity reads (checked at load: a missing definition or
        store fails the load with the reason)."""
        if not self.spec.entity_features:
            return
        if defs is None or store is None:
            raise FeatureNotFound(f"graph '{self.name}' reads entity features "
                                  f"{self.spec.entity_features} but no feature definitions or "
                                  "store are configured; set features.definitions")
        self.route = Route(_EntityPlan(handle, self.spec.entity_features, defs),  # type: ignore[arg-type]
                           None, store)
        self.entity_col = {ref: self.route.col[ref] for ref in self.spec.entity_features}

    # ------------------------------------------------------------------ steps
    def fields(self, req: PredictRequest) -> np.ndarray:
        if req.batch or len(req.fields) != 1:
            raise InvalidInput("a graph model answers one instance a request, not 'instances'")
        row = req.fields[0]
        values = []
        for name in self.spec.fields:
            v = row.get(name)
            values.append(0.0 if v is None else float(v))
        return np.asarray(values, dtype=np.float32)

    def query(self, fields: np.ndarray, items: list[SessionItem]) -> np.ndarray | None:
        """The query vector, or None for a cold start without an encoder (popularity)."""
        if self.encoder is not None:
            out = self.encoder.run(None, {self.encoder_input: fields[None, :]})[0]
            return np.ascontiguousarray(out.reshape(-1), dtype=np.float32)
        rows = [self.row_of[i.item_id] for i in items if i.item_id in self.row_of]
        if not rows:
            return None
        weights = 0.8 ** np.arange(len(rows), dtype=np.float32)  # most recent first
        q = (self.cat.embeddings[rows] * weights[:, None]).sum(axis=0)
        return np.ascontiguousarray(q, dtype=np.float32)

    def search(self, inputs: Inputs) -> Outputs:
        """The retrieval of a batch: ``queries`` [n, dim] -> ``rows`` and ``scores`` [n, K]
        (an HNSW row may end in -1: fewer than K found)."""
        q = inputs[QUERIES]
        if self.index is not None:
            scores, found = self.index.search(q, self.spec.k)
            return {"rows": found, "scores": scores}
        rows, scores = g.exact_top_k_rows(self.cat.embeddings, q, self.spec.k, self.cat.max_norm)
        return {"rows": rows, "scores": scores}

    def retrieve(self, q: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One request's candidates and scores, unbatched: the popularity order without a
        query."""
        if q is None:
            rows = self.popular
            return rows, np.zeros(len(rows), dtype=np.float32)
        return _found(self.search({QUERIES: q[None, :]}))

    async def retrieve_batched(self, q: np.ndarray, budget: Budget,
                               reserve_s: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`retrieve` of a query, searched together with the requests that reach
        retrieval with it. ``reserve_s``: what the steps after retrieval need of the budget."""
        inputs = {QUERIES: q[None, :]}
        batcher = self.retriever
        if self.upstream:
            # Case: requests are on their way here: wait for them (bounded), search as one.
            self._gathered += 1
            try:
                await self._wait_for_others(budget, reserve_s)
            finally:
                self._gathered -= 1
        elif not self._gathered:
            # Case: no other request is on its way here, so no batch can form: run at once.
            out = batcher.run_now(inputs, 1)
            if out is not None:
                return _found(out)
        try:
            out = await batcher.submit(inputs, 1, budget.deadline)
        except RedlineError:
            # Case: the batch ahead would outlast the budget (or it ran out while queued): this
            # request runs alone, now; what follows checks what is left of the budget.
            out = self.search(inputs)
        return _found(out)

    async def _wait_for_others(self, budget: Budget, reserve_s: float) -> None:
        """Until no request is on its way to retrieval, at most the recent p99 of the way
        there (and ``GATHER_MAX_S``), and never past what the budget leaves after
        ``reserve_s``: the window closes at the tightest of the waiting requests' bounds."""
        wait = min(self.way_there.estimate(), GATHER_MAX_S,
                   budget.left() - self.retrieval.estimate() - reserve_s)
        if wait <= 0:
            return
        loop = asyncio.get_running_loop()
        gate = self._gate
        if gate is None:
            gate = self._gate = loop.create_future()
        at = loop.time() + wait
        if at < self._gate_at:
            if self._gate_timer is not None:
                self._gate_timer.cancel()
            self._gate_at = at
            self._gate_timer = loop.call_at(at, self.open_gate)
        await gate

    def open_gate(self) -> None:
        """Let the waiting requests go on to the retrieval queue (all of them arrived, or the
        window closed): they resume together, so their searches are one batch."""
        gate, self._gate = self._gate, None
        if self._gate_timer is not None:
            self._gate_timer.cancel()
            self._gate_timer = None
        self._gate_at = math.inf
        if gate is not None and not gate.done():
            gate.set_result(None)

    async def rank(self, handle: ModelHandle, x: np.ndarray, budget: Budget,
                   record: RequestRecord) -> Outputs:
        """The ranker's outputs for one request's candidate rows, run together with the
        requests that reach ranking with it (the ranker version's batcher)."""
        inputs, rows = handle.prepare({handle.session.inputs[0].name: x})
        out = None
        if not self.unranked:
            # Case: no other request is on its way here: the idle fast path, when it applies.
            out = handle.infer_now(inputs, rows, record, budget.deadline)
        if out is None:
            out = await handle.infer_queued(inputs, rows, budget.deadline, LOW, record)
        return out

    def rank_rows(self, rows: np.ndarray, scores: np.ndarray, fields: np.ndarray,
                  items: list[SessionItem], entity: np.ndarray | None = None) -> np.ndarray:
        """The ranker's input: one row per candidate, columns as ``rank.features`` says."""
        n = len(rows)
        x = np.empty((n, len(self.spec.rank_features)), dtype=np.float32)
        field_at = {name: j for j, name in enumerate(self.spec.fields)}
        seen: dict[int, int] = {}
        clicks: dict[int, int] = {}
        for it in items:
            r = self.row_of.get(it.item_id)
            if r is not None:
                seen[r] = 1
                if it.type == "click":
                    clicks[r] = clicks.get(r, 0) + 1
        for j, f in enumerate(self.spec.rank_features):
            source, _, what = f.partition(":")
            if source == "retrieval":
                x[:, j] = scores if what == "score" else np.arange(n)
            elif source == "item":
                x[:, j] = self.cat.columns[what][rows]
            elif source == "field":
                x[:, j] = fields[field_at[what]]
            elif source == "entity":
                x[:, j] = entity[self.entity_col[what]] if entity is not None else np.nan
            elif what == "length":
                x[:, j] = len(items)
            elif what == "seen":
                x[:, j] = [seen.get(int(r), 0) for r in rows]
            elif what == "clicks":
                x[:, j] = [clicks.get(int(r), 0) for r in rows]
            else:
                x[:, j] = 0.0
        return x

    def rules(self, rows: np.ndarray, scores: np.ndarray,
              items: list[SessionItem]) -> list[dict[str, Any]]:
        keep = np.ones(len(rows), dtype=bool)
        if self.spec.drop_seen and items:
            seen = {self.row_of[i.item_id] for i in items if i.item_id in self.row_of}
            keep &= np.fromiter((int(r) not in seen for r in rows), bool, len(rows))
        if self.in_stock is not None:
            keep &= self.in_stock[rows] > 0
        ids = self.cat.ids
        out = []
        for r, s in zip(rows[keep][:self.spec.top_n].tolist(),
                        scores[keep][:self.spec.top_n].tolist(), strict=True):
            out.append({"item_id": ids[r], "score": s})
        return out


def _found(out: Outputs) -> tuple[np.ndarray, np.ndarray]:
    """One request's (rows, scores) of a retrieval's outputs (its row of them)."""
    rows, scores = out["rows"][0], out["scores"][0]
    if rows[-1] < 0:  # HNSW found fewer than K
        keep = rows >= 0
        return rows[keep], scores[keep]
    return rows, scores


class _EntityPlan:
    """What a :class:`Route` needs of a plan: the graph's entity feature views."""

    def __init__(self, handle: ModelHandle, refs: list[str], defs: FeatureDefinitions) -> None:
        self.handle = handle
        self.request_fields: list[str] = []
        self.views: dict[str, FeatureView] = {}
        for ref in refs:
            view, _ = defs.resolve(ref)
            self.views[view.name] = view
