"""``redline bench``: open-loop load against a V2 server, with an HDR latency report."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

import click

from redline.commands._common import emit_json, json_options
from redline.errors import ModelNotFound, Unreachable


@click.command("bench")
@click.option("--url", default=None,
              help="REST base URL (default: http://127.0.0.1:<server.http_port>, 8000), or "
                   "host:port (grpc://host:port) with --protocol grpc.")
@click.option("--model", "-m", "model", required=True, metavar="NAME", help="Model name to call.")
@click.option("--protocol", type=click.Choice(["json", "binary", "grpc"]), default="json",
              show_default=True, help="REST JSON, REST binary tensor extension, or gRPC.")
@click.option("--rate", type=float, default=None,
              help="Requests per second (open loop). Without it: closed loop at --concurrency.")
@click.option("--concurrency", "-c", type=int, default=1, show_default=True,
              help="Closed loop: requests in flight. Open loop: most connections to open.")
@click.option("--schedule", type=click.Choice(["constant", "poisson"]), default="constant",
              show_default=True, help="Open-loop arrival schedule.")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds measured.")
@click.option("--warmup", type=float, default=2.0, show_default=True, help="Seconds not measured.")
@click.option("--rows", type=int, default=1, show_default=True, help="Rows per request.")
@click.option("--budget-ms", type=float, default=None, help="Send x-redline-budget-ms.")
@click.option("--find-max", is_flag=True, help="Search the highest rate meeting --slo-p99.")
@click.option("--slo-p99", type=float, default=None, help="p99 objective in ms for --find-max.")
@click.option("--input", "input_specs", multiple=True, metavar="NAME:DATATYPE:SHAPE",
              help="Input to send (e.g. X:FP32:1x30) instead of asking the model's metadata.")
@click.option("--v1", "v1_body", default=None, metavar="JSON",
              help="Entity predictions: send this /v1 predict body ({\"entities\": ..., "
                   "\"request\": ...}) to /v1/models/MODEL/predict, or as a redline.v1 "
                   "PredictRequest with --protocol grpc.")
@json_options
def bench(url: str | None, model: str, protocol: str, rate: float | None, concurrency: int,
          schedule: str, duration: float, warmup: float, rows: int, budget_ms: float | None,
          find_max: bool, slo_p99: float | None, input_specs: tuple[str, ...],
          v1_body: str | None, as_json: bool, json_out: str | None) -> None:
    """Measure latency and throughput; latency runs from each request's scheduled send time.

    Open loop (--rate) sends on a schedule whatever the server does, so a stall shows up in the
    percentiles instead of silently slowing the sender (no coordinated omission). Without
    --rate it runs closed loop at --concurrency.

    \b
    Examples:
      redline bench -m breast_cancer --rate 500 --duration 10     # open loop, REST JSON
      redline bench -m breast_cancer -c 8 --protocol binary       # closed loop, 8 in flight
      redline bench -m breast_cancer --protocol grpc --url 127.0.0.1:8001 --rate 200
      redline bench -m breast_cancer --find-max --slo-p99 5       # top rate with p99 <= 5 ms
      redline bench -m fraud --rate 500 --v1 "$(cat .redline/demo/fraud-request.json)"
      redline bench -m breast_cancer --rate 1000 --json-out run.json
    """
    from redline.bench.runner import LoadSpec, run_load
    from redline.bench.runner import find_max as search

    if url is None:
        from redline.config import load_settings

        server = load_settings().server
        port = server.grpc_port if protocol == "grpc" else server.http_port
        url = f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}"
    if protocol == "grpc" and url.startswith("http"):
        raise click.BadParameter("gRPC needs host:port (or grpc://host:port)", param_hint="--url")
    if protocol != "grpc" and "://" not in url:
        url = f"http://{url}"  # host:port over REST
    if find_max and slo_p99 is None:
        raise click.BadParameter("--find-max needs --slo-p99 MS", param_hint="--slo-p99")
    spec = LoadSpec(url=url, model=model, protocol=protocol, rate=rate,
                    connections=concurrency if rate is None else max(concurrency, 64),
                    schedule=schedule, duration_s=duration, warmup_s=warmup, rows=rows,
                    budget_ms=budget_ms)
    if v1_body is not None:
        spec.v1_body = _v1_body(v1_body, model, protocol)
    if input_specs:
        from redline.bench.runner import synth_inputs

        spec.inputs = synth_inputs({"inputs": [_parse_input(text) for text in input_specs]}, rows)
    from redline.bench.report import print_table

    _probe(url)
    if find_max:
        assert slo_p99 is not None

        def step(result, passed):  # type: ignore[no-untyped-def]
            if not as_json:
                click.echo(f"  {result.spec.rate:>9.0f}/s  p99 {result.percentile_ms(99):8.3f} ms"
                           f"  {result.throughput:9.0f} req/s  {'ok' if passed else 'missed'}")

        with _server_errors(url, model):
            best, runs = search(spec, slo_p99, start_rate=rate or 200.0, on_step=step)
        emit_json({"slo_p99_ms": slo_p99, "max_rate": best.spec.rate if best else None,
                   "best": best.to_dict() if best else None,
                   "runs": [r.to_dict() for r in runs]}, as_json, json_out)
        if not as_json:
            print_table(runs, f"find-max, p99 <= {slo_p99} ms")
            click.echo(f"highest rate meeting p99 <= {slo_p99} ms: "
                       f"{best.spec.rate:.0f}/s" if best else "no rate met the objective")
        sys.exit(0 if best else 1)
    if as_json:
        with _server_errors(url, model):
            result = run_load(spec)
        emit_json(result.to_dict(), as_json, json_out)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[ok]}"),
                  TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task(f"{protocol} {model}", total=1.0, ok="")
        with _server_errors(url, model):
            result = run_load(spec, lambda frac, ok: bar.update(task, completed=frac,
                                                                ok=f"{ok:,} ok"))
    print_table([result])
    emit_json(result.to_dict(), False, json_out)


def _probe(url: str) -> None:
    """Refuse at once, in one line, when nothing listens at ``url``."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"grpc://{url}")
    try:
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
    except ValueError:
        raise click.BadParameter(f"{url!r} is not host:port or a URL", param_hint="--url") from None
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        raise Unreachable(f"nothing answers at {url} ({exc.strerror or exc}); start a server "
                          "with `redline serve`, or pass the right --url") from None


@contextlib.contextmanager
def _server_errors(url: str, model: str) -> Iterator[None]:
    """The server's refusals (unknown model, not V2) as one line instead of a urllib traceback."""
    import urllib.error

    try:
        yield
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ModelNotFound(f"the server at {url} has no model '{model}' (404; GET "
                                f"{url}/v2/models lists what it serves)") from None
        raise Unreachable(f"the server at {url} answered {exc.code} to the model's metadata "
                          "request") from None
    except urllib.error.URLError as exc:
        raise Unreachable(f"cannot reach {url}: {exc.reason}") from None


def _parse_input(text: str) -> dict[str, object]:
    try:
        name, datatype, shape = text.rsplit(":", 2)
        dims = [int(d) for d in shape.lower().split("x")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: use NAME:DATATYPE:SHAPE like X:FP32:1x30",
                                 param_hint="--input") from None
    return {"name": name, "datatype": datatype.upper(), "shape": dims}


def _v1_body(text: str, model: str, protocol: str) -> bytes:
    """The ``--v1`` body as sent: JSON for REST, a serialised PredictRequest for gRPC."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--v1") from None
    if protocol == "binary":
        raise click.BadParameter("--v1 sends JSON (REST) or gRPC, not the binary extension",
                                 param_hint="--protocol")
    if protocol != "grpc":
        return text.encode()
    from redline.proto import redline_v1_pb2 as v1

    rows = doc.get("instances") or [doc]
    try:
        request = v1.PredictRequest(  # type: ignore[attr-defined]
            model_name=model, session_id=doc.get("session_id", ""),
            instances=[v1.Instance(  # type: ignore[attr-defined]
                entities={k: str(v) for k, v in row.get("entities", {}).items()},
                request=row.get("request", {})) for row in rows])
    except (TypeError, ValueError, AttributeError) as exc:
        raise click.BadParameter(f"cannot make a redline.v1 PredictRequest: {exc}",
                                 param_hint="--v1") from None
    return bytes(request.SerializeToString())
