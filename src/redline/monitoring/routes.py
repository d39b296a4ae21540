"""The monitoring HTTP routes, added to the REST app through its public ``add_route``.

``GET /metrics`` (Prometheus text), ``GET /dashboard`` (the live page) and the JSON it reads,
``GET /v1/monitoring/summary`` (the last minute) and ``/v1/monitoring/history`` (every point
kept); drift and quality per model; ``POST /v1/labels``; and, behind the
admin token because they show request inputs, ``GET /v1/debug/slow`` and the review queue.
"""

from __future__ import annotations

import asyncio
import os
from importlib import resources
from typing import Any

from redline.errors import InvalidInput, NotFound
from redline.monitoring.joinstore import JoinOutcome
from redline.monitoring.timeseries import HISTORY_TICKS

MAX_LABELS = 10_000


def install_routes(app: Any, monitor: Any) -> None:
    from redline.serving.app import HttpRequest, HttpResponse

    def model_known(name: str) -> None:
        if name not in monitor.registry.models():
            raise NotFound(f"model '{name}' is not in the repository; `redline models list` "
                           "shows the models")

    async def metrics(request: HttpRequest) -> HttpResponse:
        monitor.refresh_metrics()  # this process's latest, not the last tick's
        body, content_type = monitor.export.render()
        return HttpResponse(200, body, [(b"content-type", content_type.encode())])

    async def dashboard(request: HttpRequest) -> HttpResponse:
        html = resources.files("redline.monitoring").joinpath("dashboard.html").read_bytes()
        return HttpResponse(200, html, [(b"content-type", b"text/html; charset=utf-8"),
                                        (b"cache-control", b"no-store")])

    async def summary(request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(monitor.summary())

    async def history(request: HttpRequest) -> HttpResponse:
        return HttpResponse.json(monitor.summary(HISTORY_TICKS))  # what the page opens with

    async def slow(request: HttpRequest) -> HttpResponse:
        monitor.drain()  # the records since the last tick too
        return HttpResponse.json({"window_s": monitor.slow.window_s,
                                  "requests": monitor.slow.slowest(),
                                  "worker_pid": os.getpid()})  # this worker's requests

    async def drift(request: HttpRequest) -> HttpResponse:
        name = request.params["name"]
        model_known(name)
        version = request.params.get("version")
        monitor.drain()
        reports = await asyncio.to_thread(_drift_reports, monitor, name, version)
        return HttpResponse.json({"model": name, "versions": reports,
                                  "note": None if reports else
                                  "no live traffic for this model yet: drift needs requests",
                                  "worker_pid": os.getpid()})  # over this worker's requests

    async def quality(request: HttpRequest) -> HttpResponse:
        name = request.params["name"]
        model_known(name)
        version = request.params.get("version")
        monitor.drain()
        reports = await asyncio.to_thread(_quality_reports, monitor, name, version)
        join = monitor.windows.join
        return HttpResponse.json({
            "model": name, "versions": reports,
            "unmatched_labels": await asyncio.to_thread(join.unmatched, name),
            "label_join": {"store": join.kind, "shared": join.shared,
                           "worker_pid": os.getpid()}})

    async def labels(request: HttpRequest) -> HttpResponse:
        doc = request.json()
        items = doc.get("labels") if isinstance(doc, dict) else None
        if not isinstance(items, list) or not items:
            raise InvalidInput('POST /v1/labels takes {"labels": [{"request_id": "...", '
                               '"label": 1}, ...]} (optionally "model" per item)')
        if len(items) > MAX_LABELS:
            raise InvalidInput(f"{len(items)} labels in one request; send at most {MAX_LABELS}")
        by_model: dict[str | None, tuple[list[str], list[float]]] = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "request_id" not in item or "label" not in item:
                raise InvalidInput(f"labels[{i}] must be an object with request_id and label")
            label = item["label"]
            if isinstance(label, bool) or not isinstance(label, int | float):
                raise InvalidInput(f"labels[{i}].label must be a number, got {label!r}")
            model = item.get("model", doc.get("model"))
            ids, values = by_model.setdefault(None if model is None else str(model), ([], []))
            ids.append(str(item["request_id"]))
            values.append(float(label))
        monitor.drain()  # predictions since the last tick too
        windows = monitor.windows
        joined = late = duplicate = 0
        unmatched: list[str] = []
        for model, (ids, values) in by_model.items():
            got = await asyncio.to_thread(_join, windows, model, ids, values)
            if got.unmatched and windows.join.shared:
                # Another worker may hold these predictions unwritten until its next tick.
                await asyncio.sleep(monitor.tick_s * 1.5)
                keep = set(got.unmatched)
                pairs = [(r, v) for r, v in zip(ids, values, strict=True) if r in keep]
                again = await asyncio.to_thread(_join, windows, model, [p[0] for p in pairs],
                                                [p[1] for p in pairs])
                got = JoinOutcome(got.joined + again.joined, again.unmatched,
                                  got.late + again.late, got.duplicate + again.duplicate)
            joined, late, duplicate = joined + got.joined, late + got.late, \
                duplicate + got.duplicate
            unmatched += got.unmatched
            if got.unmatched:
                await asyncio.to_thread(windows.join.count_unmatched, model, len(got.unmatched))
        monitor.export.labels.labels("joined").inc(joined)
        for outcome, n in (("unmatched", len(unmatched)), ("late", late),
                           ("duplicate", duplicate)):
            if n:
                monitor.export.labels.labels(outcome).inc(n)
        return HttpResponse.json({"joined": joined, "unmatched": len(unmatched), "late": late,
                                  "duplicate": duplicate, "unmatched_ids": unmatched[:100]})

    async def review_list(request: HttpRequest) -> HttpResponse:
        monitor.drain()
        await asyncio.to_thread(monitor.windows.absorb)
        model = request.params.get("name")
        items, stats = await asyncio.to_thread(
            lambda: (monitor.review.pending(model, 100), monitor.review.stats()))
        return HttpResponse.json({"items": items, **stats})

    async def review_label(request: HttpRequest) -> HttpResponse:
        doc = request.json()
        if not isinstance(doc, dict) or "label" not in doc:
            raise InvalidInput('POST /v1/review/{id}/label takes {"label": 1, '
                               '"reviewer": "..."}')
        item = await asyncio.to_thread(monitor.review.waiting, request.params["id"],
                                       doc["label"])
        q = monitor.windows.quality.get((item["model"], item["version"]))
        if q is not None:
            # First into quality (a shared join that is down answers 503 and the item stays
            # queued): the prediction may still wait under its request id; else the pair counts
            # directly, unless the request has a label already.
            outcome = await asyncio.to_thread(q.label_reviewed, item["request_id"],
                                              item["score"], float(doc["label"]))
            monitor.export.labels.labels(outcome).inc()
        done = await asyncio.to_thread(monitor.review.label, request.params["id"],
                                       doc["label"], doc.get("reviewer"))
        return HttpResponse.json(done)

    async def review_export(request: HttpRequest) -> HttpResponse:
        body = await asyncio.to_thread(monitor.review.export_parquet)
        return HttpResponse(200, body, [(b"content-type", b"application/vnd.apache.parquet"),
                                        (b"content-disposition",
                                         b'attachment; filename="review.parquet"')])

    add = app.add_route
    add("GET", "/metrics", metrics)
    add("GET", "/dashboard", dashboard)
    add("GET", "/v1/monitoring/summary", summary)
    add("GET", "/v1/monitoring/history", history)
    add("GET", "/v1/models/{name}/drift", drift)
    add("GET", "/v1/models/{name}/versions/{version}/drift", drift)
    add("GET", "/v1/models/{name}/quality", quality)
    add("GET", "/v1/models/{name}/versions/{version}/quality", quality)
    add("POST", "/v1/labels", labels)
    add("GET", "/v1/debug/slow", slow, admin=True)
    add("GET", "/v1/review", review_list, admin=True)
    add("GET", "/v1/review/models/{name}", review_list, admin=True)
    add("POST", "/v1/review/{id}/label", review_label, admin=True)
    add("GET", "/v1/review/export", review_export, admin=True)


CALIBRATION_WAIT_S = 2.0  # how long a drift report waits for thresholds still being computed


def _drift_reports(monitor: Any, name: str, version: str | None) -> list[dict[str, Any]]:
    monitor.windows.absorb()
    out = []
    for key in monitor.windows.versions(name):
        if version is not None and key[1] != version:
            continue
        drift = monitor.windows.drift[key]
        # A version's first server calibrates in the background: a short one is waited for
        # (this runs on a worker thread), a long one reads "calibrating" until it is done.
        if not drift.wait_calibrated(CALIBRATION_WAIT_S):
            out.append(calibrating_report(drift))
            continue
        report = drift.report()
        if not drift.has_reference:
            report["note"] = ("this version has no input profile (register it with a sample "
                              "of its training inputs); only the prediction is compared")
        monitor.drift_reports[key] = report
        out.append(report)
    return out


def calibrating_report(drift: Any) -> dict[str, Any]:
    """What a drift report says before its version's thresholds exist: no verdict yet."""
    return {"model": drift.model, "version": drift.version, "calibrating": True,
            "window": {"rows": int(drift.window.rows().shape[0]),
                       "capacity": drift.window.capacity, "seen": int(drift.window.seen),
                       "since": round(drift.window.started, 3), "min_rows": drift.min_rows,
                       "skipped_rows": drift.skipped},
            "reference": "training profile" if drift.has_reference else None,
            "features": [], "prediction": None, "drifted": [], "drift": False,
            "note": ("calibrating this version's drift thresholds (once per version, then kept "
                     "beside it); the report follows in seconds")}


def _quality_reports(monitor: Any, name: str, version: str | None) -> list[dict[str, Any]]:
    monitor.windows.absorb()
    return [q.report() for (m, v), q in sorted(monitor.windows.quality.items())
            if m == name and (version is None or v == version)]


def _join(windows: Any, model: str | None, ids: list[str], values: list[float]
          ) -> JoinOutcome:
    windows.absorb()  # this worker's latest predictions first
    return windows.label_many(model, ids, values)  # type: ignore[no-any-return]
