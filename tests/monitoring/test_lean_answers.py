"""The monitored V2 path (flat stage times, records only where needed) answers every request,
hostile ones included, exactly as the unmonitored path does: same status, same body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.monitoring.served import in_process_pair


def _dumps(doc: Any) -> bytes:
    """JSON as a careless client writes it: integers beyond 64 bits, bare NaN and Infinity."""
    return json.dumps(doc).encode()


PATHS = ["/v2/models/fraud/infer", "/v2/models/fraud/versions/1/infer",
         "/v2/models/fraud/versions/9/infer", "/v2/models/nope/infer",
         "/v2/models/fraud/versions/²/infer"]

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20),
                    st.text(max_size=3), st.none(), st.booleans())
tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "y", ""]),
     "datatype": st.sampled_from(["FP32", "FP64", "INT64", "BYTES", "fp32", "FP16"]),
     "shape": st.lists(st.integers(-2, 4), max_size=3),
     "data": st.lists(numbers, max_size=9)})
common = st.builds(lambda rows, rid: {"inputs": [{"name": "x", "datatype": "FP32",
                                                  "shape": [len(rows) // 3, 3],
                                                  "data": rows[: len(rows) // 3 * 3]}],
                                      **({"id": rid} if rid is not None else {})},
                   st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=3, max_size=12),
                   st.one_of(st.none(), st.text(max_size=8)))
bodies = st.one_of(
    common.map(_dumps),
    st.builds(lambda ts, extra: _dumps({"inputs": ts, **extra}), st.lists(tensor, max_size=2),
              st.dictionaries(st.sampled_from(["id", "outputs", "parameters"]),
                              st.one_of(st.text(max_size=4), st.lists(st.integers(), max_size=2),
                                        st.dictionaries(st.text(max_size=3), numbers, max_size=2)),
                              max_size=2)),
    st.binary(max_size=40),
    st.just(b"[" * 2000 + b"]" * 2000),
)
headers = st.lists(st.sampled_from([
    (b"x-redline-budget-ms", b"5000"), (b"x-redline-budget-ms", b"-5"),
    (b"x-redline-budget-ms", b"nan"), (b"x-redline-budget-ms", b"0.000001"),
    (b"x-redline-priority", b"high"), (b"x-redline-priority", b"urgent"),
    (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    (b"traceparent", b"garbage"), (b"inference-header-content-length", b"abc"),
    (b"content-length", b"99999999999"),
]), max_size=3, unique=True)


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    loop = asyncio.new_event_loop()
    servers = in_process_pair(tmp_path_factory, loop)
    yield {"loop": loop, "off": servers[False].app, "on": servers[True].app}
    loop.close()


def _answer(app: Any, loop: asyncio.AbstractEventLoop, path: str,
            head: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, bytes]:
    got: list[tuple[int, bytes]] = []

    def respond(status: int, payload: bytes, out: list[tuple[bytes, bytes]]) -> None:
        got.append((status, payload))

    later = app.infer_inline(path, head, body, respond)
    if later is not None:  # queued: finish it as the HTTP protocol would
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        loop.run_until_complete(later({}, None, send))
        got.append((sent[0]["status"], sent[1]["body"]))
    assert len(got) == 1
    return got[0]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(PATHS), head=headers, body=bodies)
def test_monitored_and_unmonitored_answer_alike(apps: dict[str, Any], path: str,
                                                head: list[tuple[bytes, bytes]],
                                                body: bytes) -> None:
    head = [*head, (b"host", b"x")]
    off = _answer(apps["off"], apps["loop"], path, head, body)
    on = _answer(apps["on"], apps["loop"], path, head, body)
    assert on[0] == off[0], (on, off)
    assert on[0] < 500, on
    if off[0] == 200:
        assert orjson.loads(on[1]) == orjson.loads(off[1])
    else:
        assert orjson.loads(on[1])["code"] == orjson.loads(off[1])["code"]
