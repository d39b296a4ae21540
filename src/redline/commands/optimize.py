"""``redline optimize`` and ``redline gate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from redline.commands._common import config_option, load_table, repository_option, settings_and_repo
from redline.errors import InvalidInput


def _load_data(path: str, label: str, feature_names: list[str] | None,
               need_labels: bool) -> tuple[Any, Any]:
    """Rows (float32, in the model's feature order when the file has named columns) and labels."""
    import numpy as np

    suffix = Path(path).suffix.lower()
    if suffix not in (".npz", ".csv", ".parquet"):
        raise InvalidInput(f"unsupported data file {path}: use .npz (arrays X and y), or .csv / "
                           f".parquet with a '{label}' label column (--label)")
    try:
        x, y, columns = load_table(path, label=label if suffix != ".npz" else None)
    except InvalidInput:
        if need_labels or suffix == ".npz":
            raise
        x, y, columns = load_table(path, label=None)  # labels are optional for this run
    if columns is not None and feature_names:
        missing = [f for f in feature_names if f not in columns]
        if missing:
            raise InvalidInput(f"{path} lacks the model's feature column(s) {missing} "
                               f"(columns: {columns})")
        x = x[:, [columns.index(f) for f in feature_names]]
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or len(x) == 0:
        raise InvalidInput(f"{path} must hold a non-empty 2-D table of rows; got shape {x.shape}")
    if need_labels and y is None:
        raise InvalidInput(f"{path} has no labels: an .npz needs an array 'y' next to 'X'")
    if y is not None and len(y) != len(x):
        raise InvalidInput(f"{path} has {len(x)} rows but {len(y)} labels")
    return x, y


@click.command(context_settings={"max_content_width": 100})
@click.argument("model")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False),
              help="Validation rows with labels: .npz (X, y), or .csv/.parquet with a label "
                   "column.")
@click.option("--label", default="label", show_default=True,
              help="Label column of a .csv/.parquet file.")
@click.option("--version", "version", default=None,
              help="Version or alias to optimize (default: production, else latest).")
@click.option("--train-data", type=click.Path(dir_okay=False),
              help="Separate rows for calibration, fine-tuning and distillation; then all of "
                   "--data is used for evaluation (default: split --data in two).")
@click.option("--techniques", default=",".join(["graph", "quantize", "fp16", "prune", "magnitude",
                                                "trees", "distill"]), show_default=True,
              help="Comma-separated techniques to try.")
@click.option("--tolerance", type=float, default=0.01, show_default=True,
              help="Largest relative loss in the metric a candidate may have (0.01 = 1%).")
@click.option("--metric", type=click.Choice(["accuracy", "roc_auc", "log_loss", "rmse"]),
              help="Metric to judge by (default: accuracy, or rmse for regression).")
@click.option("--batch-size", type=int, default=None,
              help="Typical server batch, measured next to batch 1 (default: batching."
                   "max_batch_size from redline.yaml, 32).")
@click.option("--rounds", type=int, default=300, show_default=True,
              help="Interleaved latency rounds per batch size.")
@click.option("--max-seconds", type=float, default=30.0, show_default=True,
              help="Stop latency rounds early after this long per batch size.")
@click.option("--rank-by", type=click.Choice(["p50", "p99"]), default="p50", show_default=True,
              help="Latency figure that decides 'fastest' (at the typical batch size).")
@click.option("--min-speedup", type=float, default=1.05, show_default=True,
              help="Register only if the best candidate is at least this much faster.")
@click.option("--register/--no-register", default=True, show_default=True,
              help="Store the chosen candidate in the repository.")
@click.option("--as-fallback", is_flag=True,
              help="Register as a separate fallback model (NAME-fast) instead of a new version.")
@click.option("--fallback-name", help="Name of the fallback model (with --as-fallback).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write a JSON report.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False),
              help="Write a Markdown report.")
@click.option("--fast", is_flag=True, help="Fewer variants and epochs: a quick look, or tests.")
@click.option("--seed", type=int, default=0, show_default=True)
@repository_option
@config_option
def optimize(model: str, data_path: str, label: str, version: str | None, train_data: str | None,
             techniques: str, tolerance: float, metric: str | None, batch_size: int | None,
             rounds: int, max_seconds: float, rank_by: str, min_speedup: float, register: bool,
             as_fallback: bool, fallback_name: str | None, json_path: str | None,
             markdown_path: str | None, fast: bool, seed: int, repository: str | None,
             config_path: str | None) -> None:
    """Make faster candidates of MODEL, measure them all on the same data, register the best.

    Candidates: ONNX Runtime graph levels and threads, int8 quantization (dynamic, and static QDQ
    with MinMax/Entropy/Percentile calibration, leaving accuracy-critical nodes in float), fp16
    (GPU only), structured and magnitude pruning of MLPs, fewer trees for forests and boosted
    models, and a distilled MLP student. Each is measured at batch 1 and the typical batch in
    one interleaved run, with its metric and its largest output change; the fastest one that
    loses at most --tolerance (relative) is registered with its recipe and profile.

    \b
    Examples:
      redline optimize fraud --data val.npz
      redline optimize fraud --data val.csv --label is_fraud --metric roc_auc
      redline optimize digits --data val.npz --techniques quantize,prune --tolerance 0.005
      redline optimize forest --data val.parquet --as-fallback --markdown report.md
      redline optimize fraud --data val.npz --no-register --json report.json
    """
    from redline.models import ModelRepository
    from redline.optimize import OptimizeOptions, register_candidate
    from redline.optimize import optimize as run_optimize
    from redline.optimize.register import link_fallback
    from redline.optimize.report import RichProgress, print_report, write_reports

    settings, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    meta = repo.metadata(model, version)
    x, y = _load_data(data_path, label, meta.feature_names, need_labels=True)
    tune = _load_data(train_data, label, meta.feature_names, True) if train_data else None
    options = OptimizeOptions(
        techniques=[t.strip() for t in techniques.split(",") if t.strip()],
        tolerance=tolerance, metric=metric,
        batch_size=batch_size or settings.batching_for(model).max_batch_size,
        rounds=rounds, max_seconds=max_seconds, seed=seed, fast=fast, rank_by=rank_by,
        min_speedup=min_speedup,
    )
    data = repo.model_path(model, meta.version).read_bytes()
    repo.verify(model, meta.version)
    with RichProgress() as progress:
        report = run_optimize(
            data, x, y, task=meta.task, class_labels=meta.class_labels, options=options,
            base_settings=settings.runtime, name=model, version=meta.version, tune=tune,
            progress=progress,
        )
    if report.chosen and register:
        new = register_candidate(repo, meta, report, report.result(report.chosen),
                                 as_fallback=as_fallback, fallback_name=fallback_name)
        report.registered = {"model": new.name, "version": new.version, "fallback": as_fallback}
        if as_fallback:
            linked = link_fallback(repo, meta, new.name)
            report.registered["linked_version"] = linked.version
    print_report(report)
    if report.registered and as_fallback:
        click.echo(f"{model} version {report.registered['linked_version']} is version "
                   f"{meta.version} with fallback '{report.registered['model']}' "
                   f"(promote it to serve with the fallback: redline models promote {model} "
                   f"{report.registered['linked_version']})")
    write_reports(report, json_path, markdown_path)


@click.command(context_settings={"max_content_width": 100})
@click.option("--model", "model", required=True, help="Model name.")
@click.option("--candidate", required=True, help="Candidate version (or alias) to check.")
@click.option("--baseline", default="production", show_default=True,
              help="Version or alias to compare with.")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False),
              help="Rows to measure on: .npz (X, y) or .csv/.parquet with a label column.")
@click.option("--label", default="label", show_default=True, help="Label column of .csv/.parquet.")
@click.option("--p99-ms", type=float, help="Latency budget: fail (exit 10) if the candidate's "
              "p99 is over it.")
@click.option("--max-slowdown", type=float, default=1.2, show_default=True,
              help="Fail (exit 11) if the candidate's median latency exceeds this multiple of "
                   "the baseline's; 0 turns the check off.")
@click.option("--max-accuracy-drop", type=float, help="Fail (exit 12) if the metric is worse "
              "than the baseline's by more than this, in the metric's units (0.01 = 1 point).")
@click.option("--max-disagreement", type=float, default=0.01, show_default=True,
              help="Fail (exit 13) if more than this share of rows get a different answer "
                   "(label, or a regression value off by >0.1%); 1 turns the check off.")
@click.option("--metric", type=click.Choice(["accuracy", "roc_auc", "log_loss", "rmse"]))
@click.option("--batch-size", type=int, default=1, show_default=True,
              help="Batch size the latency is measured at.")
@click.option("--rounds", type=int, default=500, show_default=True,
              help="Interleaved latency rounds.")
@click.option("--max-seconds", type=float, default=30.0, show_default=True)
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False),
              help="Write a Markdown summary (for a pull-request comment).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False),
              help="Write JUnit XML (one test case per check) for CI systems.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write JSON results.")
@repository_option
@config_option
def gate(model: str, candidate: str, baseline: str, data_path: str, label: str,
         p99_ms: float | None, max_slowdown: float, max_accuracy_drop: float | None,
         max_disagreement: float, metric: str | None, batch_size: int, rounds: int,
         max_seconds: float, markdown_path: str | None, junit_path: str | None,
         json_path: str | None, repository: str | None, config_path: str | None) -> None:
    """Fail CI when a candidate version misses its latency budget or loses accuracy.

    Candidate and baseline are measured side by side in one interleaved run on the same rows.

    \b
    Exit codes:
      0   passed
      2   usage error (unknown model or version, missing data, wrong features)
      10  candidate p99 over --p99-ms
      11  candidate slower than the baseline by more than --max-slowdown
      12  metric worse than the baseline by more than --max-accuracy-drop
      13  answers differ from the baseline on more than --max-disagreement of rows
    Several failures: the first code in this order; every reason is printed.

    \b
    Examples:
      redline gate --model fraud --candidate 4 --p99-ms 5 --max-accuracy-drop 0.01 \\
          --data val.npz
      redline gate --model fraud --candidate 4 --baseline 3 --max-slowdown 1.1 \\
          --data val.csv --label is_fraud --markdown gate.md --junit gate.xml
    """
    from redline.models import ModelRepository
    from redline.optimize import GateOptions, run_gate

    settings, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    meta = repo.metadata(model, candidate)
    x, y = _load_data(data_path, label, meta.feature_names,
                      need_labels=max_accuracy_drop is not None)
    options = GateOptions(
        p99_ms=p99_ms, max_accuracy_drop=max_accuracy_drop,
        max_slowdown=max_slowdown or None,
        max_disagreement=None if max_disagreement >= 1 else max_disagreement,
        batch_size=batch_size, rounds=rounds, max_seconds=max_seconds, metric=metric,
    )
    result = run_gate(repo, model, candidate, x, y, baseline=baseline, options=options,
                      settings=settings.runtime)
    if markdown_path:
        Path(markdown_path).write_text(result.to_markdown())
    if junit_path:
        Path(junit_path).write_text(result.to_junit())
    if json_path:
        Path(json_path).write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    click.echo(result.summary(), err=not result.passed)
    if not result.passed:
        raise SystemExit(result.exit_code)
