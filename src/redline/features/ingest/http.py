"""HTTP push: ``POST /v1/events`` (a JSON array, one object, or JSON lines) into the ingest core;
mounted by the serving edge or served alone by ``redline ingest http``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from redline.errors import InvalidInput, PayloadTooLarge
from redline.features.ingest.core import Ingestor
from redline.features.ingest.push import EventPush


def parse_body(body: bytes, max_events: int = 100_000) -> list[Any]:
    """A JSON array of events, one JSON object, or JSON lines → raw events (each validated
    later, so one bad event does not reject the batch)."""
    text = body.strip()
    if not text:
        raise InvalidInput("empty body: send a JSON array of events, one object, or JSON lines")
    try:
        whole = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if text[:1] == b"[" or b"\n" not in text:
            raise InvalidInput(f"body is not valid JSON: {exc}") from exc
        whole = None  # JSON lines: each line is parsed (and dead-lettered) on its own
    raws: list[Any]
    if whole is None:
        raws = [ln for ln in text.splitlines() if ln.strip()]
    elif isinstance(whole, list):
        raws = [x if isinstance(x, dict) else orjson.dumps(x) for x in whole]
    else:
        raws = [whole if isinstance(whole, dict) else text]
    if len(raws) > max_events:
        raise PayloadTooLarge(f"{len(raws)} events in one request; send at most {max_events}")
    return raws


async def handle_events(push: EventPush, body: bytes) -> tuple[int, bytes]:
    """``POST /v1/events``: 200 with counts and per-event reasons; 4xx for a bad body, 503 when
    the store did not take the write (the sender sends the batch again: a source with an
    ``event_id`` applies a resent event once)."""
    from redline.errors import RedlineError

    try:
        raws = parse_body(body)
        res = await push.apply(raws)
    except RedlineError as exc:
        return exc.http_status, orjson.dumps(exc.to_v2())
    return 200, orjson.dumps({
        "accepted": res.accepted, "rejected": len(res.rejected),
        "errors": [{"index": r.tag, "reason": r.reason} for r in res.rejected[:100]],
    })


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


def events_asgi_app(ingestor: Ingestor, max_body_bytes: int = 16 * 1024 * 1024) -> ASGIApp:
    """A tiny ASGI app: ``POST /v1/events``, ``GET /v1/ingest/stats``, ``GET /healthz``."""
    from redline.errors import RedlineError

    push = EventPush(lambda: ingestor, on_loop=ingestor.store.kind == "memory")

    async def send_json(send: Any, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            return await send_json(send, 200, b'{"status":"ok"}')
        if path == "/v1/ingest/stats" and method == "GET":
            return await send_json(send, 200, orjson.dumps(ingestor.stats()))
        if path != "/v1/events":
            return await send_json(send, 404, b'{"error":"not found: POST /v1/events",'
                                              b'"code":"not_found"}')
        if method != "POST":
            return await send_json(send, 405, b'{"error":"use POST","code":"method_not_allowed"}')
        chunks = []
        size = 0
        more = True
        while more:
            msg = await receive()
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > max_body_bytes:
                err = PayloadTooLarge(f"body larger than {max_body_bytes} bytes; split the batch")
                return await send_json(send, err.http_status, orjson.dumps(err.to_v2()))
            chunks.append(chunk)
            more = msg.get("more_body", False)
        try:
            status, body = await handle_events(push, b"".join(chunks))
        except RedlineError as exc:
            status, body = exc.http_status, orjson.dumps(exc.to_v2())
        await send_json(send, status, body)

    return app
