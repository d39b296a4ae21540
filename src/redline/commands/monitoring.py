"""``redline top``, ``redline drift``, ``redline review``: a running server, from a terminal.

They read the server's monitoring routes over HTTP (standard library only), so they work against
any redline server, local or not.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from redline.commands._common import emit_json, json_options, model_option
from redline.errors import InvalidInput, NotFound, RedlineError, Unauthorized, Unreachable

STAGE_ORDER = ("decode", "admission", "features", "sessions", "queue", "inference", "encode",
               "total")


def url_option(func: Any) -> Any:
    return click.option("--url", default=None,
                        help="The server's HTTP address (default: http://127.0.0.1:"
                             "<server.http_port>, 8000).")(func)


def token_option(func: Any) -> Any:
    return click.option("--admin-token", envvar="REDLINE_ADMIN_TOKEN", default=None,
                        metavar="TOKEN",
                        help="Needed for the slow-request log and the review queue (default: "
                             "env REDLINE_ADMIN_TOKEN, else server.admin_token).")(func)


def _defaults(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The local server's address and admin token from the settings, where not given."""
    if url is not None and token is not None:
        return url, token
    from redline.config import load_settings

    server = load_settings().server
    url = url or f"http://127.0.0.1:{server.http_port}"
    return (url if "://" in url else f"http://{url}"), token or server.admin_token


def call(url: str, path: str, token: str | None = None, body: Any = None,
         raw: bool = False) -> Any:
    """One request to the server; its errors become one clear line."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data,
                                     method="POST" if data is not None else "GET")
    if data is not None:
        request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
            message = doc.get("error", "")
        except (ValueError, AttributeError):
            message = ""
        if exc.code == 401:
            raise Unauthorized(f"{path} needs the admin token: pass --admin-token (or set "
                               f"REDLINE_ADMIN_TOKEN); the server said: {message}") from None
        if exc.code == 404:
            raise NotFound(message or f"{url} has no route {path}") from None
        raise RedlineError(f"{url}{path} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"cannot reach {url} ({reason}); start a server with `redline serve`"
                          ", or pass the right --url") from None
    return payload if raw else json.loads(payload)


# ---------------------------------------------------------------------- redline top
@click.command()
@url_option
@token_option
@model_option
@click.option("--interval", type=float, default=1.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one view and exit (no live screen).")
@json_options
def top(url: str | None, admin_token: str | None, model: str | None, interval: float,
        once: bool, as_json: bool, json_out: str | None) -> None:
    """Live view of a running server: rate, p50/p95/p99 per stage, errors, queue, batch size.

    One row per stage of each series (API, model, version), the last second's figures; below,
    the slowest requests of the last minute with their stage timings (with --admin-token).
    With several workers behind the port each view is the answering worker's (its pid shown).

    \b
    Examples:
      redline top                                  # refreshes every second; Ctrl-C to stop
      redline top -m fraud --admin-token "$TOKEN"  # one model, with the slow-request log
      redline top --once --json                    # one snapshot as JSON (scripts, CI)
    """
    from rich.console import Console, Group
    from rich.live import Live

    url, admin_token = _defaults(url, admin_token)
    console = Console()
    if once or as_json:
        view = snapshot(url, admin_token, model)
        emit_json(view, as_json, json_out)
        if not as_json:
            console.print(render_top(view))
        return
    with Live(console=console, auto_refresh=False, screen=False) as live:
        try:
            while True:
                live.update(Group(render_top(snapshot(url, admin_token, model))), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            return


def snapshot(url: str, token: str | None, model: str | None) -> dict[str, Any]:
    summary = call(url, "/v1/monitoring/summary")
    history = summary.get("history") or []
    last = history[-1] if history else {"series": {}, "models": {}}
    series = {k: v for k, v in last.get("series", {}).items()
              if model is None or v.get("model") == model}
    models = {k: v for k, v in last.get("models", {}).items()
              if model is None or v.get("model") == model}
    view: dict[str, Any] = {"url": url, "time": last.get("t"), "series": series,
                            "models": models, "slow": None,
                            "worker_pid": summary.get("worker_pid")}
    if token:
        slow = call(url, "/v1/debug/slow", token)["requests"]
        view["slow"] = [s for s in slow if model is None or s["model"] == model]
    return view


def render_top(view: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    when = time.strftime("%H:%M:%S", time.localtime(view["time"])) if view["time"] else "–"
    # With several workers behind the port each refresh shows the worker that answered.
    pid = view.get("worker_pid")
    worker = f"  worker pid {pid}" if pid else ""
    parts: list[Any] = [Text(f"redline {view['url']}{worker}  {when}  (last second)",
                             style="bold")]
    if not view["series"]:
        parts.append(Text("no requests in the last second"))
    for key, s in sorted(view["series"].items()):
        m = view["models"].get(f"{s['model']}:{s['version']}", {})
        batch = m.get("batch_mean")
        title = (f"{key}  {s['rate']:,.0f} req/s · {s['errors']} errors · queue "
                 f"{m.get('queue', '–')} · batch {'–' if batch is None else batch}")
        table = Table(title=title, title_justify="left")
        for col in ("stage", "n", "p50 µs", "p95 µs", "p99 µs"):
            table.add_column(col, justify="left" if col == "stage" else "right")
        for stage in [st for st in STAGE_ORDER if st in s["stages"]]:
            v = s["stages"][stage]
            table.add_row(stage, f"{v['n']:,}", _us(v["p50"]), _us(v["p95"]), _us(v["p99"]))
        parts.append(table)
    if view["slow"] is not None:
        slow = Table(title="slowest requests, last minute", title_justify="left")
        for col in ("total µs", "series", "status", "request id", "stages µs"):
            slow.add_column(col, justify="right" if col == "total µs" else "left")
        for r in view["slow"][:10]:
            stages = " ".join(f"{k}={v}" for k, v in r["stages_us"].items())
            slow.add_row(_us(r["total_us"]), f"{r['api']}:{r['model']}:{r['version']}",
                         r["status"], r["request_id"] or "–", stages)
        parts.append(slow)
    return Group(*parts)


def _us(v: Any) -> str:
    return "–" if v is None else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


# ---------------------------------------------------------------------- redline drift
@click.command()
@url_option
@model_option
@click.option("--version", "version", default=None, help="One version (default: every version "
              "with live traffic).")
@json_options
def drift(url: str | None, model: str | None, version: str | None, as_json: bool,
          json_out: str | None) -> None:
    """Drift of a served model's live inputs and predictions against its training profile.

    Per feature: PSI and Jensen-Shannon distance (all), Wasserstein in reference standard
    deviations (numeric), missing and out-of-range rates, each against its calibrated
    effect-size threshold, and the window they were computed over.

    \b
    Examples:
      redline drift -m fraud
      redline drift -m fraud --version 2 --json
    """
    if not model:
        raise click.UsageError("name the model with -m/--model NAME, e.g. `redline drift -m "
                               "fraud`")
    url, _ = _defaults(url, "")
    path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "") + "/drift"
    doc = call(url, path)
    emit_json(doc, as_json, json_out)
    if as_json:
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not doc["versions"]:
        console.print(f"{model}: {doc.get('note') or 'no report'}")
        return
    for r in doc["versions"]:
        w = r["window"]
        verdict = "[red]DRIFT[/]: " + ", ".join(r["drifted"]) if r["drift"] else "[green]no drift"
        if r.get("calibrating"):
            verdict = "[yellow]calibrating[/] (no verdict yet)"
        table = Table(title=f"{r['model']} v{r['version']}: {verdict}  (window {w['rows']:,} "
                      f"of {w['capacity']:,} rows, {w['seen']:,} seen)", title_justify="left")
        for col in ("feature", "kind", "psi", "js", "wasserstein", "missing", "out of range",
                    "drift"):
            table.add_column(col, justify="left" if col in ("feature", "kind") else "right")
        items = list(r["features"]) + ([r["prediction"]] if r.get("prediction") else [])
        for f in items:
            stats, limits = f.get("statistics", {}), f.get("thresholds", {})

            def cell(k: str, stats: dict[str, float] = stats,
                     limits: dict[str, float] = limits) -> str:
                if k not in stats:
                    return "–"
                mark = "[red]" if stats[k] > limits[k] else ""
                return f"{mark}{stats[k]:.3f}[/] / {limits[k]:.3f}" if mark else \
                    f"{stats[k]:.3f} / {limits[k]:.3f}"

            table.add_row(f["feature"], f["kind"], cell("psi"), cell("js"), cell("wasserstein"),
                          f"{f['missing_rate']:.1%}", f"{f['out_of_range_rate']:.1%}",
                          "[red]yes[/]" if f["drift"] else ("–" if "reason" in f else "no"))
        console.print(table)
        if r.get("note"):
            console.print(f"[dim]{r['note']}[/]")


# ---------------------------------------------------------------------- redline review
@click.group(invoke_without_command=True)
@url_option
@token_option
@model_option
@json_options
@click.pass_context
def review(ctx: click.Context, url: str | None, admin_token: str | None, model: str | None,
           as_json: bool, json_out: str | None) -> None:
    """The human review queue: uncertain, out-of-range and drifted requests to label.

    Without a subcommand it lists what waits. Needs the admin token (the items show request
    inputs).

    \b
    Examples:
      redline review --admin-token "$TOKEN"                  # what waits for a label
      redline review --admin-token "$TOKEN" label r12 1      # item r12 is class 1
      redline review --admin-token "$TOKEN" export labels.parquet
    """
    url, admin_token = _defaults(url, admin_token)
    ctx.obj = {"url": url, "token": admin_token}
    if ctx.invoked_subcommand is not None:
        return
    path = "/v1/review" + (f"/models/{model}" if model else "")
    doc = call(url, path, admin_token)
    emit_json(doc, as_json, json_out)
    if as_json:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"review queue: {doc['waiting']} waiting, {doc['labelled']} labelled, "
                  f"{doc['rate_limited']} skipped by the rate limit", title_justify="left")
    for col in ("id", "model", "request id", "reasons", "prediction", "features"):
        table.add_column(col)
    for item in doc["items"]:
        feats = ", ".join(f"{k}={v}" for k, v in list(item["features"].items())[:8])
        table.add_row(item["id"], f"{item['model']}:{item['version']}", item["request_id"] or "–",
                      "; ".join(item["reasons"]), f"{item['prediction']:.4g}"
                      if isinstance(item["prediction"], float) else str(item["prediction"]),
                      feats)
    Console().print(table)


@review.command("label")
@click.argument("item_id")
@click.argument("label", type=float)
@click.option("--reviewer", default=None, help="Who labelled it (kept in the export).")
@click.pass_obj
def review_label(obj: dict[str, Any], item_id: str, label: float, reviewer: str | None) -> None:
    """Label one waiting item: ITEM_ID (from the list) and LABEL (class or target value).

    \b
    Examples:
      redline review --admin-token "$TOKEN" label r12 1 --reviewer ana
    """
    body = {"label": int(label) if label.is_integer() else label,
            "reviewer": reviewer or os.environ.get("USER", "")}
    item = call(obj["url"], f"/v1/review/{item_id}/label", obj["token"], body)
    click.echo(f"labelled {item['id']} ({item['model']}:{item['version']}, request "
               f"{item['request_id'] or '–'}) as {item['label']:g}")


@review.command("export")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def review_export(obj: dict[str, Any], path: str) -> None:
    """Write the labelled items to PATH as Parquet (features, prediction, label) for retraining.

    \b
    Examples:
      redline review --admin-token "$TOKEN" export labels.parquet
    """
    if not path.endswith(".parquet"):
        raise InvalidInput(f"{path}: the export is Parquet; name the file *.parquet")
    data = call(obj["url"], "/v1/review/export", obj["token"], raw=True)
    Path(path).write_bytes(data)
    click.echo(f"wrote {path} ({len(data):,} bytes)")
