"""One ``/v1`` request through a served graph (``graph.yaml``): sessions and features, query,
retrieve, rank, rules, each a stage on the request's record, with the budget checked before the
steps that have a recent p99 (``docs/recommend.md``). The version's loaded parts and the
cross-request batching live on its :class:`~redline.serving.predict.graph.GraphRunner`; this is
the procedure each request follows through them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from redline.errors import DeadlineExceeded, ModelNotReady, Overloaded
from redline.serving.deadline import Budget
from redline.serving.handle import ModelHandle
from redline.serving.predict.graph import RETRIEVAL_PATH, GraphRunner
from redline.serving.predict.latency import LatencyWindow
from redline.serving.predict.request import PredictRequest, entity_ids
from redline.serving.predict.sessions import SessionItem
from redline.serving.stages import (
    FEATURES,
    QUERY,
    RANK,
    RETRIEVE,
    RULES,
    SESSIONS,
    RequestRecord,
    perf_ns,
)

if TYPE_CHECKING:
    from redline.serving.predict.pipeline import PredictPipeline


def _score(outputs: dict[str, np.ndarray], names: list[str], n: int) -> np.ndarray:
    """The ranker's score per candidate: a regressor's value, a binary classifier's positive
    probability."""
    probs = next((outputs[k] for k in names if outputs[k].ndim == 2 and outputs[k].shape[1] == 2
                  and outputs[k].dtype.kind == "f"), None)
    if probs is not None:
        return probs[:, 1]
    main = next((outputs[k] for k in names if outputs[k].dtype.kind == "f"), outputs[names[0]])
    return main.reshape(n, -1)[:, 0].astype(np.float32)


async def run_graph(runner: GraphRunner, handle: ModelHandle, req: PredictRequest,
                    budget: Budget, window: LatencyWindow, pipeline: PredictPipeline,
                    record: RequestRecord, t: int) -> dict[str, Any]:
    """One request through the graph; the answer document (``docs/recommend.md``)."""
    reasons: list[str] = []
    entity: np.ndarray | None = None
    items: list[SessionItem] = []
    # On its way to retrieval and ranking: a batch there may take it along.
    runner.upstream += 1
    runner.unranked += 1
    unranked = True
    session_read: asyncio.Future[tuple[list[SessionItem], int]] | None = None
    try:
        try:
            fields = runner.fields(req)
            record.rows = 1
            route = runner.route
            retrieval_p99 = runner.retrieval.estimate()
            sid = req.session_id
            reserve = retrieval_p99 + window.estimate()  # what follows the session read
            ids = (entity_ids(route.keys, route.entity_names, handle.name, req.entities, False)
                   if route is not None else None)  # (a missing key fails before any read)
            if sid is not None and route is not None and pipeline.features.loop_redis:
                # Sent now, beside the features' read: the two share one round trip.
                session_read = asyncio.ensure_future(_timed(
                    lambda: pipeline.read_session_items(sid, runner.spec.session_items, budget,
                                                        reserve, reasons)))
            start = t
            if route is not None and ids is not None:
                got = await pipeline.features.read(route, ids, 1, budget, window.estimate(),
                                                   reasons)
                entity = got[0][0]
                t = _mark(record, FEATURES, t)
            if session_read is not None:
                items, ended = await session_read
                record.add(SESSIONS, start, ended)
            elif sid is not None:  # the only read, or one that runs inline
                items = await pipeline.read_session_items(sid, runner.spec.session_items,
                                                          budget, reserve, reasons)
                t = _mark(record, SESSIONS, t)
            t = perf_ns()
            runner.way_there.add((t - record.start_ns) * 1e-9)
        finally:
            runner.upstream -= 1
            if not runner.upstream:
                runner.open_gate()  # the last one on its way arrived: the batch can go
            if session_read is not None and not session_read.done():
                session_read.cancel()  # the features' read failed the request
        path = "primary"
        searched = runner.encoder is not None or bool(items)  # else the popularity order, free
        p99 = retrieval_p99 if searched else 0.0
        if p99 and not budget.fits(p99, 0.0) and not runner.retrieval.probe():
            reasons.append(f"budget: {max(0.0, budget.left()) * 1e3:.2f} ms left < retrieval "
                           f"p99 {p99 * 1e3:.2f} ms: candidates in popularity order")
            path = RETRIEVAL_PATH
            rows, scores = runner.retrieve(None)
        else:
            t0 = t
            q = runner.query(fields, items)
            t = _mark(record, QUERY, t)
            if q is None:
                rows, scores = runner.retrieve(None)
            else:
                rows, scores = await runner.retrieve_batched(q, budget, window.estimate())
            t = _mark(record, RETRIEVE, t)
            if q is not None:
                runner.retrieval.add((t - t0) * 1e-9)
        p99 = window.estimate()
        if p99 and not budget.fits(p99, 0.0) and not window.probe():
            reasons.append(f"budget: {max(0.0, budget.left()) * 1e3:.2f} ms left < ranker p99 "
                           f"{p99 * 1e3:.2f} ms: answered in retrieval order")
            path = RETRIEVAL_PATH
        else:
            x = runner.rank_rows(rows, scores, fields, items, entity)
            t = _mark(record, RANK, t)
            runner.unranked -= 1
            unranked = False
            try:
                t0 = perf_ns()
                out = await runner.rank(handle, x, budget, record)
                window.add((perf_ns() - t0) * 1e-9)
            except (Overloaded, DeadlineExceeded, ModelNotReady) as exc:
                reasons.append(f"ranker refused ({exc.code}): answered in retrieval order")
                path = RETRIEVAL_PATH
            else:
                ranked = _score(out, handle.output_names, len(rows))
                order = np.argsort(-ranked, kind="stable")
                rows, scores = rows[order], ranked[order]
            t = perf_ns()
    finally:
        if unranked:
            runner.unranked -= 1
    answer = runner.rules(rows, scores, items)
    _mark(record, RULES, t)
    record.path = path
    doc: dict[str, Any] = {
        "model_name": handle.name, "model_version": handle.version_str, "path": path,
        "degraded": bool(reasons), "degraded_reasons": reasons,
    }
    if req.request_id is not None:
        doc["request_id"] = req.request_id
    doc["items"] = answer
    doc["retrieved"] = len(rows)
    doc["timings_us"] = record.timings_us()
    return doc


async def _timed(read: Callable[[], Awaitable[list[SessionItem]]]
                 ) -> tuple[list[SessionItem], int]:
    """The session items and when their read ended (it runs beside the features' read; made
    here, so a read cancelled before it starts leaves nothing un-awaited)."""
    items = await read()
    return items, perf_ns()


def _mark(record: RequestRecord, stage: str, since: int) -> int:
    now = perf_ns()
    record.add(stage, since, now)
    return now
