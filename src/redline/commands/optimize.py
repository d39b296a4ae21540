"""``redline optimize`` and ``redline gate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from redline.commands._common import config_option, load_table, repository_option, settings_and_repo
from redline.errors import InvalidInput


def _load_data(path: str, label: str, feature_names: list[str] | None,
               need_labels: bool, *, missing_values: str = "reject", model: str = "model",
               option: str = "--data") -> tuple[Any, Any]:
    """Rows (float32, in the model's feature order when the file has named columns) and labels,
    with NaN/inf refused when the model rejects missing values (as its server would)."""
    import numpy as np

    from redline.optimize.safety import check_data

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
    names = feature_names or columns
    check_data(x, y, policy=missing_values, what=f"{option} {path}", model=model,
               columns=list(names) if names and len(names) == x.shape[1] else None)
    return x, y


@click.command(context_settings={"max_content_width": 100})
@click.argument("model_arg", metavar="[MODEL]", required=False)
@click.option("-m", "--model", "model_opt", help="Model name (or give it as the argument).")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False),
              help="Labelled rows: .npz (X, y), or .csv/.parquet with a label column. Split "
                   "into fit, choice and evaluation rows (a third each) unless --train-data "
                   "gives the fit rows.")
@click.option("--label", default="label", show_default=True,
              help="Label column of a .csv/.parquet file.")
@click.option("--version", "version", default=None,
              help="Version or alias to optimize (default: the one serving today — the "
                   "production alias, else the newest promoted or ordinary version).")
@click.option("--train-data", type=click.Path(dir_okay=False),
              help="Separate fit rows for calibration, fine-tuning and distillation; --data is "
                   "then split into choice and evaluation rows only.")
@click.option("--techniques", default=",".join(["graph", "quantize", "fp16", "prune", "magnitude",
                                                "trees", "distill"]), show_default=True,
              help="Comma-separated techniques to try.")
@click.option("--tolerance", type=float, default=None,
              help="Largest relative loss in the metric (0.01 = 1%), by the worse end of the "
                   "95% interval. Default: optimize.tolerance (0.01).")
@click.option("--metric", type=click.Choice(["accuracy", "roc_auc", "log_loss", "brier",
                                             "rmse"]),
              help="Metric to judge by (default: accuracy, or rmse for regression).")
@click.option("--eval-fn", metavar="MODULE:FUNCTION",
              help="Your own metric, fn(y_true, scores, labels) -> float, higher is better "
                   "(see --eval-fn-lower-is-better); replaces --metric.")
@click.option("--eval-fn-lower-is-better", is_flag=True,
              help="The --eval-fn value is a loss (lower is better).")
@click.option("--guard-metric", default="auto", show_default=True,
              help="A second metric no candidate may worsen by more than --guard-tolerance: "
                   "auto (log loss for probability outputs), none, or a metric name.")
@click.option("--guard-tolerance", type=float, default=None,
              help="Largest relative loss in the guard metric. Default: "
                   "optimize.guard_tolerance (0.10).")
@click.option("--calibration-rows", type=int, default=None,
              help="Fit rows that calibrate static int8 ranges. Default: "
                   "optimize.calibration_rows (512).")
@click.option("--calibration-methods", default=None,
              help="Static int8 calibration methods, comma-separated: minmax, entropy, "
                   "percentile (default: all; minmax with --fast).")
@click.option("--per-channel/--per-tensor", default=None,
              help="int8 weight scales per output channel or per tensor (default: per-tensor "
                   "for dynamic, per-channel for static).")
@click.option("--reduce-range", is_flag=True,
              help="7-bit int8 weights: avoids saturation on CPUs without VNNI.")
@click.option("--quant-preprocess/--no-quant-preprocess", default=True, show_default=True,
              help="Run ONNX Runtime's quant_pre_process (shape inference, graph cleanup) "
                   "before quantizing.")
@click.option("--batch-size", type=int, default=None,
              help="Typical server batch, measured next to batch 1 (default: batching."
                   "max_batch_size from redline.yaml, 32).")
@click.option("--rounds", type=int, default=None,
              help="Timed calls per candidate and batch size (default: optimize.rounds, 300).")
@click.option("--passes", type=int, default=None,
              help="Interleaved passes; each loads every model in turn (one session at a "
                   "time, in an order drawn at random and mirrored in the next pass), warms it "
                   "until its timings settle and times it, and is one paired observation of "
                   "every speed-up, so at least 2 give an interval (default: optimize.passes, "
                   "5).")
@click.option("--bootstrap", type=int, default=None,
              help="Bootstrap resamples behind each 95% interval (default: 500).")
@click.option("--max-seconds", type=float, default=30.0, show_default=True,
              help="Stop latency passes early after this long per batch size.")
@click.option("--rank-by", type=click.Choice(["p50", "p99"]), default="p50", show_default=True,
              help="Latency figure that decides 'fastest' (at the typical batch size).")
@click.option("--min-speedup", type=float, default=1.05, show_default=True,
              help="Register only if the lower end of the best candidate's 95% speed-up "
                   "interval (paired pass by pass with the original) reaches this: a speed-up "
                   "the machine's noise could produce keeps the original.")
@click.option("--register/--no-register", default=True, show_default=True,
              help="Store the chosen candidate in the repository (it serves only once "
                   "promoted).")
@click.option("--as-fallback", is_flag=True,
              help="Register as a separate fallback model (NAME-fast) instead of a new version.")
@click.option("--fallback-name", help="Name of the fallback model (with --as-fallback).")
@click.option("--json", "json_stdout", is_flag=True, help="Print the report as JSON to stdout.")
@click.option("--json-out", "json_path", type=click.Path(dir_okay=False),
              help="Write the report as JSON to FILE.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False),
              help="Write a Markdown report to FILE.")
@click.option("--fast", is_flag=True, help="Fewer variants and epochs: a quick look, or tests.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the row split, resamples and training.")
@repository_option
@config_option
def optimize(model_arg: str | None, model_opt: str | None, data_path: str, label: str,
             version: str | None, train_data: str | None, techniques: str,
             tolerance: float | None, metric: str | None, eval_fn: str | None,
             eval_fn_lower_is_better: bool, guard_metric: str, guard_tolerance: float | None,
             calibration_rows: int | None, calibration_methods: str | None,
             per_channel: bool | None, reduce_range: bool, quant_preprocess: bool,
             batch_size: int | None, rounds: int | None, passes: int | None,
             bootstrap: int | None, max_seconds: float, rank_by: str, min_speedup: float,
             register: bool, as_fallback: bool, fallback_name: str | None, json_stdout: bool,
             json_path: str | None, markdown_path: str | None, fast: bool, seed: int,
             repository: str | None, config_path: str | None) -> None:
    """Make faster candidates of MODEL, measure them all on the same data, register the best.

    Candidates: ONNX Runtime graph levels above the configured one and more threads, int8
    quantization (dynamic, and static QDQ with MinMax/Entropy/Percentile calibration, leaving
    accuracy-critical nodes in float), fp16 (GPU only), structured and magnitude pruning of
    MLPs, fewer trees for forests and boosted models, and a distilled MLP student. Techniques
    learn on the fit rows, the pick is made on the choice rows (the table shows those figures
    beside the status they decide), the evaluation rows confirm it and give every other figure,
    each with a 95% bootstrap interval. Latency is timed one session at a time over interleaved
    passes, each session warmed until its timings settle, and each speed-up carries a 95%
    interval paired pass by pass; the winner must clear --min-speedup by its interval's lower
    end, and candidates within noise of each other are reported as tied. A candidate must keep
    the original's contract (inputs, outputs, missing-value policy); one with a NaN weight or
    answer, or the same bytes run the same way, is not a candidate. The winner is registered as
    a new version that serves only once promoted (redline gate --promote production, or
    redline models promote).

    \b
    Examples:
      redline optimize fraud --data val.npz
      redline optimize -m fraud --data val.csv --label is_fraud --metric roc_auc
      redline optimize -m digits --data val.npz --techniques quantize,prune --tolerance 0.005
      redline optimize -m digits --data val.npz --train-data train.npz --calibration-rows 256 \\
          --per-tensor --reduce-range --eval-fn mymetrics:profit
      redline optimize -m forest --data val.parquet --as-fallback --markdown report.md
      redline optimize -m fraud --data val.npz --no-register --json-out report.json
    """
    from redline.models import ModelRepository
    from redline.optimize import OptimizeOptions, register_candidate
    from redline.optimize import optimize as run_optimize
    from redline.optimize.candidates import QuantizationOptions
    from redline.optimize.register import link_fallback
    from redline.optimize.report import print_report, stderr_progress, to_json, write_reports
    from redline.optimize.user_metric import load_user_metric

    model = _model_name(model_arg, model_opt)
    settings, root = settings_and_repo(config_path, repository)
    defaults = settings.optimize
    repo = ModelRepository(root)
    meta = repo.metadata(model, version)
    x, y = _load_data(data_path, label, meta.feature_names, need_labels=True,
                      missing_values=meta.missing_values, model=model)
    tune = _load_data(train_data, label, meta.feature_names, True,
                      missing_values=meta.missing_values, model=model,
                      option="--train-data") if train_data else None
    methods = tuple(m.strip() for m in calibration_methods.split(",") if m.strip()) \
        if calibration_methods else None
    unknown = sorted(set(methods or ()) - {"minmax", "entropy", "percentile"})
    if unknown:
        raise InvalidInput(f"unknown calibration method(s) {unknown}; use minmax, entropy, "
                           "percentile")
    options = OptimizeOptions(
        techniques=[t.strip() for t in techniques.split(",") if t.strip()],
        tolerance=defaults.tolerance if tolerance is None else tolerance, metric=metric,
        eval_fn=load_user_metric(eval_fn, higher_is_better=not eval_fn_lower_is_better)
        if eval_fn else None,
        guard_metric=guard_metric,
        guard_tolerance=defaults.guard_tolerance if guard_tolerance is None else guard_tolerance,
        batch_size=batch_size or settings.batching_for(model).max_batch_size,
        rounds=rounds or defaults.rounds, passes=passes or defaults.passes,
        bootstrap=bootstrap or defaults.bootstrap, max_seconds=max_seconds, seed=seed,
        fast=fast, rank_by=rank_by, min_speedup=min_speedup,
        quantization=QuantizationOptions(
            preprocess=quant_preprocess, per_channel=per_channel, reduce_range=reduce_range,
            calibration_rows=calibration_rows or defaults.calibration_rows, methods=methods),
    )
    data = repo.model_path(model, meta.version).read_bytes()
    repo.verify(model, meta.version)
    serving = repo.aliases(model).get("production")
    click.echo(f"optimizing {model} v{meta.version}"
               + (" (production)" if serving == meta.version else
                  f" (named; production is v{serving})" if serving else
                  " (serving by default: no production alias)"), err=True)
    with stderr_progress() as progress:  # a bar on a terminal, a line per step in a log
        report = run_optimize(
            data, x, y, task=meta.task, class_labels=meta.class_labels, options=options,
            base_settings=settings.runtime, name=model, version=meta.version, tune=tune,
            missing_values=meta.missing_values, feature_names=meta.feature_names,
            progress=progress,
        )
    if report.chosen and register:
        new = register_candidate(repo, meta, report, report.result(report.chosen),
                                 as_fallback=as_fallback, fallback_name=fallback_name)
        report.registered = {"model": new.name, "version": new.version, "fallback": as_fallback,
                             "serving": False}
        if as_fallback:
            linked = link_fallback(repo, meta, new.name)
            report.registered["linked_version"] = linked.version
    if json_stdout:
        print_report(report, console=_stderr_console())
        click.echo(to_json(report), nl=False)
    else:
        print_report(report)
    if report.registered and as_fallback:
        click.echo(f"{model} version {report.registered['linked_version']} is version "
                   f"{meta.version} with fallback '{report.registered['model']}' "
                   f"(promote it to serve with the fallback: redline models promote -m {model} "
                   f"--version {report.registered['linked_version']})", err=json_stdout)
    write_reports(report, json_path, markdown_path)


def _model_name(argument: str | None, option: str | None) -> str:
    if argument and option and argument != option:
        raise InvalidInput(f"two model names given ({argument!r} and -m {option!r}); give one")
    name = option or argument
    if not name:
        raise InvalidInput("name the model: redline optimize -m NAME --data FILE")
    return name


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@click.command(context_settings={"max_content_width": 100})
@click.option("-m", "--model", "model", required=True, help="Model name.")
@click.option("--candidate", required=True, help="Candidate version (or alias) to check.")
@click.option("--baseline", default="production", show_default=True,
              help="Version or alias to compare with (the one serving today).")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False),
              help="Rows to measure on: .npz (X, y) or .csv/.parquet with a label column. Use "
                   "rows that did not choose the candidate (not optimize's --data).")
@click.option("--label", default="label", show_default=True, help="Label column of .csv/.parquet.")
@click.option("--p99-ms", type=float, help="Latency budget: fail (exit 10) if the candidate's "
              "p99 is over it.")
@click.option("--max-slowdown", type=float, default=1.2, show_default=True,
              help="Fail (exit 11) if the candidate's median latency is more than this multiple "
                   "of the baseline's by the whole 95% interval of their ratio (paired pass by "
                   "pass), so the machine's noise does not fail an identical build; 0 turns it "
                   "off.")
@click.option("--max-accuracy-drop", type=float, help="Fail (exit 12) if the metric is worse "
              "than the baseline's by more than this, in the metric's units (0.01 = 1 point).")
@click.option("--max-disagreement", type=float, default=None,
              help="Classifiers: fail (exit 13) if more than this share of rows get a different "
                   "label. Default: the baseline's error rate on the gate's rows (at least 2%), "
                   "or 10% without labels — an ordinary retrain passes it. 1 turns it off.")
@click.option("--max-relative-error", type=float, default=None,
              help="Regressors: fail (exit 13) if RMS(candidate - baseline) exceeds this share "
                   "of the baseline's RMSE on --data (default 1.0: answers may move by as much "
                   "as the baseline is wrong), or, without labels, of the spread of the "
                   "baseline's answers (default 0.15). 0 turns it off.")
@click.option("--allow-signature-change", is_flag=True,
              help="The candidate's inputs, outputs or class labels change on purpose: report "
                   "the change but do not fail on it (exit 14 otherwise).")
@click.option("--metric", type=click.Choice(["accuracy", "roc_auc", "log_loss", "brier",
                                             "rmse"]),
              help="Metric for --max-accuracy-drop (default: accuracy, or rmse for regression).")
@click.option("--batch-size", type=int, default=1, show_default=True,
              help="Batch size the latency is measured at.")
@click.option("--rounds", type=int, default=500, show_default=True,
              help="Timed calls per model, spread over --passes.")
@click.option("--passes", type=int, default=10, show_default=True,
              help="Interleaved passes; in each, one model's session at a time is loaded, "
                   "warmed and timed. Each pass is one paired observation of the slowdown.")
@click.option("--max-seconds", type=float, default=30.0, show_default=True,
              help="Stop timing early after this long (both models keep equal samples).")
@click.option("--promote", "promote_alias", default=None, metavar="ALIAS",
              help="When the gate passes, point ALIAS (e.g. production) at the candidate: the "
                   "step that makes an optimized candidate serve.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False),
              help="Write a Markdown summary (for a pull-request comment).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False),
              help="Write JUnit XML (one test case per check) for CI test views.")
@click.option("--json", "json_stdout", is_flag=True, help="Print the result as JSON to stdout.")
@click.option("--json-out", "json_path", type=click.Path(dir_okay=False),
              help="Write the result as JSON to FILE.")
@repository_option
@config_option
def gate(model: str, candidate: str, baseline: str, data_path: str, label: str,
         p99_ms: float | None, max_slowdown: float, max_accuracy_drop: float | None,
         max_disagreement: float | None, max_relative_error: float | None,
         allow_signature_change: bool, metric: str | None, batch_size: int, rounds: int,
         passes: int, max_seconds: float, promote_alias: str | None,
         markdown_path: str | None, junit_path: str | None, json_stdout: bool,
         json_path: str | None, repository: str | None, config_path: str | None) -> None:
    """Fail CI when a candidate version breaks the contract, misses its latency budget or
    answers worse than the version serving today.

    The signatures are compared first (input names, dtypes and shapes, output names, class
    labels and their order). Then both models are measured on the same rows: one session alive
    at a time over interleaved passes, every metric with a 95% bootstrap interval and the
    slowdown with a 95% interval paired pass by pass.

    \b
    Exit codes:
      0   passed
      2   usage error (unknown model or version, missing data, data that fit neither model)
      14  signature changed (checked first; other checks are not run)
      10  candidate p99 over --p99-ms
      11  candidate slower than the baseline by more than --max-slowdown (whole interval)
      12  metric worse than the baseline by more than --max-accuracy-drop
      13  answers differ from the baseline's beyond --max-disagreement / --max-relative-error
    Several failures: the first code in this order; every reason is printed.

    \b
    Examples:
      redline gate -m fraud --candidate 4 --p99-ms 5 --max-accuracy-drop 0.01 --data gate.npz
      redline gate -m fraud --candidate 4 --baseline 3 --max-slowdown 1.1 \\
          --data gate.csv --label is_fraud --markdown gate.md --junit gate.xml
      redline gate -m fraud --candidate 5 --data gate.npz --promote production
    """
    from redline.models import ModelRepository
    from redline.optimize import GateOptions, run_gate

    settings, root = settings_and_repo(config_path, repository)
    repo = ModelRepository(root)
    meta = repo.metadata(model, candidate)
    base_meta = repo.metadata(model, baseline)
    policy = "allow" if meta.missing_values == base_meta.missing_values == "allow" else "reject"
    x, y = _load_data(data_path, label, meta.feature_names or base_meta.feature_names,
                      need_labels=max_accuracy_drop is not None, missing_values=policy,
                      model=model)
    options = GateOptions(
        p99_ms=p99_ms, max_accuracy_drop=max_accuracy_drop,
        max_slowdown=max_slowdown or None,
        max_disagreement=max_disagreement,
        check_disagreement=max_disagreement is None or max_disagreement < 1,
        max_relative_error=max_relative_error or None,
        check_relative_error=max_relative_error != 0,
        allow_signature_change=allow_signature_change,
        batch_size=batch_size, rounds=rounds, passes=passes, max_seconds=max_seconds,
        metric=metric,
    )
    result = run_gate(repo, model, candidate, x, y, baseline=baseline, options=options,
                      settings=settings.runtime)
    if result.passed and promote_alias:
        repo.promote(model, result.candidate_version, promote_alias)
        result.promoted = promote_alias
    if markdown_path:
        Path(markdown_path).write_text(result.to_markdown())
    if junit_path:
        Path(junit_path).write_text(result.to_junit())
    payload = json.dumps(result.to_dict(), indent=2, default=str) + "\n"
    if json_path:
        Path(json_path).write_text(payload)
    if json_stdout:
        click.echo(payload, nl=False)
        click.echo(result.summary(), err=True)
    else:
        click.echo(result.summary(), err=not result.passed)
    if not result.passed:
        raise SystemExit(result.exit_code)
