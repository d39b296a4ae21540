"""``GET /v2/openapi.json`` describes the whole REST surface, and the server keeps to it:
schemathesis generates requests from the document (a few hundred, bounded) against a live
server and checks that none gets a 5xx and every answer matches the documented status, content
type and schema."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.serving.conftest import ADMIN_TOKEN
from tests.serving.helpers import ServerThread

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast


def test_the_document_covers_every_route(served: ServerThread) -> None:
    doc = httpx.get(f"{served.http}/v2/openapi.json", timeout=10).json()
    assert doc["openapi"] == "3.1.0"
    paths = doc["paths"]
    infer = paths["/v2/models/{name}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"] == \
        "#/components/schemas/inference_request"
    assert "429" in infer["responses"] and "retry-after" in str(infer["responses"]["429"]).lower()
    mounted = {(r.method.lower(), r.template) for r in served.server.app._routes}
    listed = {(m, p) for p, ops in paths.items() for m in ops}
    assert mounted == listed


def test_no_5xx_and_answers_match_the_document(served: ServerThread) -> None:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    schema = schemathesis.openapi.from_url(f"{served.http}/v2/openapi.json")
    schema.config.update(base_url=served.http)
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/unload"):
            continue  # unloading a model would change what the other cases see

        # 10 examples an operation (about 300 requests): the answers of 20 (about 600, four
        # times the time, the later examples being the larger ones) had the same operations and
        # status codes, each one, when compared; derandomized, so the same cases every run.
        @settings(max_examples=10, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case) -> None:  # type: ignore[no-untyped-def]
            nonlocal calls
            if case.path.startswith("/v2/repository"):
                case.headers = {**(case.headers or {}),
                                "authorization": f"Bearer {ADMIN_TOKEN}"}
            calls += 1
            case.call_and_validate(timeout=30, checks=checks)

        run()
    assert calls >= 200  # bounded, but a few hundred requests
