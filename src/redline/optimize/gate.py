"""The CI gate: check a candidate version's contract against the baseline's, then measure both
on the same rows (one session alive at a time, interleaved passes) and fail with a readable
reason (and a distinct exit code) when the candidate breaks the latency budget, is slower than
the baseline, less accurate, or answers differently on too many rows.

Exit codes (stable, for CI scripts): 0 passed; 14 the signature changed (input names, dtypes or
shapes, output names, class labels or their order); 10 p99 over budget; 11 slower than the
baseline; 12 accuracy dropped; 13 answers differ from the baseline's (classification: share of
changed labels; regression: relative error); 2 a usage error (unknown model, bad data). A
signature change is checked first: when it fails (and was not declared intended with
``allow_signature_change``) the models are not run, since clients of the baseline would break
whatever the numbers say. Otherwise, when several checks fail, the code is that of the first in
the order above; every reason is printed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import InvalidInput
from redline.models import ModelMetadata, ModelRepository
from redline.models.runtime import settings_for_version
from redline.optimize.profile import (
    METRIC_DIRECTION,
    PROPER_SCORES,
    Latency,
    ModelRunner,
    Outputs,
    answer_difference,
    measure_latency,
    metric_rows,
    primary_metric,
    same_labels,
)
from redline.optimize.signature import signature_differences
from redline.optimize.speed import latency_ratio
from redline.optimize.uncertainty import MetricRows, Resamples, interval, share_interval

EXIT_PASSED = 0
EXIT_P99 = 10
EXIT_SLOWDOWN = 11
EXIT_ACCURACY = 12
EXIT_DISAGREEMENT = 13
EXIT_SIGNATURE = 14

# Default answer-change tolerances, and why (docs/optimization.md shows the measurements):
# two equally good classifiers disagree on roughly half the rows either gets wrong (retrains of
# a forest, an MLP, XGBoost and bagged LightGBM with a new seed disagreed on 3.5-6% of rows at
# 9-16% error), so by default a candidate may change as many labels as the baseline gets wrong
# on the gate's rows, at least 2%; without labels, 10%.
MIN_DISAGREEMENT = 0.02
UNLABELED_DISAGREEMENT = 0.10
# For regression the answer change is the RMS of (candidate - baseline), measured against the
# baseline's own RMSE on the gate's rows when there are labels: as a classifier may change as
# many labels as the baseline gets wrong, a regressor may move its answers by as much as the
# baseline is wrong. Retrains with a new seed moved them 0.10-0.54 of the RMSE (MLP, forest,
# histogram boosting on Friedman #1, diabetes and a linear problem); every answer shifted by
# +60 at an RMSE of 24.6 moves them 2.4. Without labels the scale is the spread (RMS around the
# mean) of the baseline's answers, where retrains moved 0.02-0.16 and 0.15 is the bound.
MAX_ERROR_SHARE = 1.0
MAX_RELATIVE_ERROR = 0.15


@dataclass
class GateOptions:
    p99_ms: float | None = None
    max_accuracy_drop: float | None = None  # absolute, in the metric's own units
    # candidate p50 / baseline p50; fails only when its whole 95% interval is above this
    max_slowdown: float | None = 1.2
    # classification: share of rows whose label changes; None = automatic (see above)
    max_disagreement: float | None = None
    check_disagreement: bool = True
    # regression: RMS(candidate - baseline) as a share of the baseline's RMSE (with labels)
    # or of the spread of its answers (without); None: the defaults above
    max_relative_error: float | None = None
    check_relative_error: bool = True
    allow_signature_change: bool = False
    batch_size: int = 1
    rounds: int = 500
    passes: int = 10  # more, shorter passes: each is one paired observation of the ratio
    max_seconds: float | None = 30.0
    metric: str | None = None
    bootstrap: int = 500


@dataclass
class Check:
    name: str
    exit_code: int
    passed: bool | None  # None: not requested, or not run
    message: str
    measured: float | None = None
    limit: float | None = None
    interval: list[float] | None = None  # 95% bootstrap interval of ``measured``


@dataclass
class GateResult:
    model: str
    candidate_version: int
    baseline_version: int
    baseline_ref: str
    metric: str
    rows: int
    batch_size: int
    candidate: dict[str, float]
    baseline: dict[str, float]
    checks: list[Check] = field(default_factory=list)
    intervals: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    signature_changes: list[str] = field(default_factory=list)
    promoted: str | None = None

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return self.failures[0].exit_code if self.failures else EXIT_PASSED

    def summary(self) -> str:
        head = (f"gate {'PASSED' if self.passed else 'FAILED'}: {self.model} v"
                f"{self.candidate_version} against {self.baseline_ref} (v{self.baseline_version})"
                f" on {self.rows} rows, batch {self.batch_size}")
        lines = [head] + [f"  [{'ok' if c.passed else 'FAIL'}] {c.message}"
                          for c in self.checks if c.passed is not None]
        lines += [f"  [--] {c.name}: {c.message}" for c in self.checks
                  if c.passed is None and c.message.startswith("not run")]
        if self.promoted:
            lines.append(f"  promoted v{self.candidate_version} to '{self.promoted}'")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "candidate_version": self.candidate_version,
            "baseline_version": self.baseline_version, "baseline": self.baseline_ref,
            "metric": self.metric, "rows": self.rows, "batch_size": self.batch_size,
            "passed": self.passed, "exit_code": self.exit_code,
            "measured": {"candidate": self.candidate, "baseline": self.baseline},
            "intervals": self.intervals, "signature_changes": self.signature_changes,
            "checks": [c.__dict__ for c in self.checks], "promoted": self.promoted,
        }

    def _figure(self, who: str, key: str) -> str:
        value = (self.candidate if who == "candidate" else self.baseline).get(key)
        if value is None or value != value:
            return "-"
        ci = self.intervals.get(who, {}).get(key)
        return f"{value:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")

    def to_markdown(self) -> str:
        icon = "✅" if self.passed else "❌"
        lines = [
            f"### {icon} redline gate {'passed' if self.passed else 'failed'}: "
            f"`{self.model}` v{self.candidate_version} vs {self.baseline_ref} "
            f"(v{self.baseline_version})", "",
        ]
        if self.signature_changes:
            lines += ["Signature changes:", ""] + [f"- {d}" for d in self.signature_changes]
            lines.append("")
        if "p50_ms" in self.candidate:
            lines += [
                f"Measured on {self.rows} rows, batch {self.batch_size}: one session alive at "
                "a time, interleaved passes; metric figures with 95% bootstrap intervals.", "",
                "| | baseline | candidate |", "|---|---:|---:|",
                f"| p50 latency (ms) | {self.baseline['p50_ms']:.4f} | "
                f"{self.candidate['p50_ms']:.4f} |",
                f"| p99 latency (ms) | {self.baseline['p99_ms']:.4f} | "
                f"{self.candidate['p99_ms']:.4f} |",
            ]
            for key in sorted(k for k in self.candidate if k not in ("p50_ms", "p99_ms")):
                lines.append(f"| {key} | {self._figure('baseline', key)} | "
                             f"{self._figure('candidate', key)} |")
            lines.append("")
        lines += ["| check | limit | measured | result |", "|---|---:|---:|---|"]
        for c in self.checks:
            if c.passed is None:
                if c.message.startswith("not run"):
                    lines.append(f"| {c.name} | - | - | {_cell(c.message)} |")
                continue
            measured = _fmt(c.measured) + (f" [{_fmt(c.interval[0])}, {_fmt(c.interval[1])}]"
                                           if c.interval else "")
            result = "pass" if c.passed else "**FAIL**: " + _cell(c.message)
            lines.append(f"| {c.name} | {_fmt(c.limit)} | {measured} | {result} |")
        return "\n".join(lines) + "\n"

    def to_junit(self) -> str:
        """JUnit XML: one case per check; as the schema says, ``tests`` counts every case,
        skipped ones included."""
        suite = ET.Element("testsuite", name="redline-gate", tests=str(len(self.checks)),
                           failures=str(len(self.failures)), errors="0",
                           skipped=str(sum(c.passed is None for c in self.checks)))
        for c in self.checks:
            case = ET.SubElement(suite, "testcase", classname=f"redline.gate.{self.model}",
                                 name=c.name)
            if c.passed is None:
                ET.SubElement(case, "skipped", message=c.message)
            elif not c.passed:
                failure = ET.SubElement(case, "failure", message=c.message,
                                        type=f"exit-{c.exit_code}")
                failure.text = c.message
            else:
                ET.SubElement(case, "system-out").text = c.message
        root = ET.Element("testsuites", tests=str(len(self.checks)),
                          failures=str(len(self.failures)))
        root.append(suite)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _load(repo: ModelRepository, name: str, ref: str | int | None) -> tuple[ModelMetadata, bytes]:
    meta = repo.verify(name, ref)  # checks the file against its recorded sha256
    return meta, repo.model_path(name, meta.version).read_bytes()


def _widths(meta: ModelMetadata) -> int | None:
    if len(meta.inputs) == 1 and len(meta.inputs[0].shape) == 2 and meta.inputs[0].shape[1] > 0:
        return meta.inputs[0].shape[1]
    return None


def run_gate(
    repo: ModelRepository,
    name: str,
    candidate: str | int,
    x: np.ndarray,
    y: np.ndarray | None,
    *,
    baseline: str | int = "production",
    options: GateOptions | None = None,
    settings: RuntimeSettings | None = None,
) -> GateResult:
    opts = options or GateOptions()
    cand_meta, cand_bytes = _load(repo, name, candidate)
    base_meta, base_bytes = _load(repo, name, baseline)
    metric = primary_metric(cand_meta.task, opts.metric)
    changes = signature_differences(base_meta, cand_meta)
    result = GateResult(name, cand_meta.version, base_meta.version, str(baseline), metric,
                        len(x), opts.batch_size, {}, {}, signature_changes=changes)
    sig = Check("signature", EXIT_SIGNATURE, not changes,
                "signature unchanged (inputs, outputs, class labels)" if not changes else
                "signature changed: " + "; ".join(changes) + " — clients of the baseline "
                "would break; pass --allow-signature-change if this is intended")
    if changes and opts.allow_signature_change:
        sig = Check("signature", EXIT_SIGNATURE, True,
                    "signature changed, declared intended: " + "; ".join(changes))
    if changes and not opts.allow_signature_change:
        result.checks = [sig] + [
            Check(n, code, None, "not run: the signature differs")
            for n, code in (("p99_budget", EXIT_P99), ("slowdown", EXIT_SLOWDOWN),
                            ("accuracy", EXIT_ACCURACY), ("disagreement", EXIT_DISAGREEMENT))]
        return result
    _check_fit(x, name, base_meta, cand_meta)
    if opts.max_slowdown is not None and opts.passes < 2:
        raise InvalidInput("the slowdown check pairs the models pass by pass and needs at "
                           "least 2 passes (--passes); or turn it off with --max-slowdown 0")
    if opts.max_accuracy_drop is not None and y is None:
        raise InvalidInput("--max-accuracy-drop needs labels: pass --data with a label column")
    base_settings = settings or RuntimeSettings()

    def factory(data: bytes, meta: ModelMetadata) -> Callable[[], ModelRunner]:
        def build() -> ModelRunner:  # with the settings the server would load it with
            return ModelRunner(data, task=cand_meta.task, class_labels=meta.class_labels,
                               settings=settings_for_version(base_settings, meta),
                               name=f"{name} v{meta.version}")
        return build

    factories = {"baseline": factory(base_bytes, base_meta),
                 "candidate": factory(cand_bytes, cand_meta)}
    labels_of = {"baseline": base_meta.class_labels, "candidate": cand_meta.class_labels}
    outputs = {k: make().predict(x) for k, make in factories.items()}  # one session at a time
    resamples = Resamples(len(x), opts.bootstrap, seed=0)
    measured: dict[str, dict[str, float]] = {"baseline": {}, "candidate": {}}
    replicates: dict[str, dict[str, np.ndarray]] = {"baseline": {}, "candidate": {}}
    if y is not None:
        for key, out in outputs.items():
            for m in _gate_metrics(cand_meta.task, metric):
                rows = metric_rows(cand_meta.task, m, out, y, labels_of[key])
                if rows is None:
                    continue
                reps = resamples.replicates(rows)
                measured[key][m] = _full_value(rows, len(x))
                replicates[key][m] = reps
                result.intervals.setdefault(key, {})[m] = interval(reps).to_list()
    latency = measure_latency(factories, x, [opts.batch_size], rounds=opts.rounds,
                              passes=opts.passes, max_seconds=opts.max_seconds)
    for key in factories:
        lat = latency[key][opts.batch_size]
        measured[key].update(p50_ms=lat.p50_us / 1000, p99_ms=lat.p99_us / 1000)
    cand, base = measured["candidate"], measured["baseline"]
    result.candidate, result.baseline = cand, base
    result.checks = [
        sig, _check_p99(cand, opts),
        slowdown_check(latency["candidate"][opts.batch_size],
                       latency["baseline"][opts.batch_size], opts),
        _check_accuracy(metric, measured, replicates, opts),
        _check_answers(cand_meta.task, outputs, y, opts, resamples),
    ]
    return result


def _gate_metrics(task: str, metric: str) -> list[str]:
    if task != "classification":
        return ["rmse"]
    return list(dict.fromkeys([metric, "accuracy", *PROPER_SCORES]))


def _full_value(rows: MetricRows, n: int) -> float:
    if rows.per_row is not None:
        return float(rows.finish(np.asarray([np.mean(rows.per_row)]))[0])
    assert rows.on_rows is not None
    return float(rows.on_rows(np.arange(n)))


def _check_fit(x: np.ndarray, name: str, base: ModelMetadata, cand: ModelMetadata) -> None:
    """Data must fit both models: a clear error, never an ONNX Runtime traceback."""
    wants = {"baseline": _widths(base), "candidate": _widths(cand)}
    misfit = {who: w for who, w in wants.items() if w is not None and w != x.shape[1]}
    if misfit:
        fits = [who for who in wants if who not in misfit]
        raise InvalidInput(
            f"the data has {x.shape[1]} features per row but model '{name}' "
            + ", ".join(f"{who} v{(base if who == 'baseline' else cand).version} expects {w}"
                        for who, w in misfit.items())
            + (f" (it fits the {fits[0]} only)" if fits else "")
            + "; the gate compares both on the same rows: pass rows with the models' features")


def _check_p99(cand: dict[str, float], opts: GateOptions) -> Check:
    if opts.p99_ms is None:
        return Check("p99_budget", EXIT_P99, None, "no p99 budget given")
    ok = cand["p99_ms"] <= opts.p99_ms
    verb = "within" if ok else "over"
    return Check("p99_budget", EXIT_P99, ok,
                 f"candidate p99 {cand['p99_ms']:.4f} ms is {verb} the {opts.p99_ms:g} ms budget"
                 f" (batch {opts.batch_size})", cand["p99_ms"], opts.p99_ms)


def slowdown_check(candidate: Latency, baseline: Latency, opts: GateOptions) -> Check:
    """Fails only when the whole interval of the paired ratio is over the limit: a slowdown
    the machine's noise could produce is not held against the candidate."""
    if opts.max_slowdown is None:
        return Check("slowdown", EXIT_SLOWDOWN, None, "no slowdown limit given")
    slowdown = latency_ratio(candidate, baseline)
    cand, base = {"p50_ms": candidate.p50_us / 1000}, {"p50_ms": baseline.p50_us / 1000}
    ok = bool(slowdown.interval.low <= opts.max_slowdown)
    ci = slowdown.interval
    return Check("slowdown", EXIT_SLOWDOWN, ok,
                 f"candidate median latency is {slowdown.text()} the baseline's "
                 f"({cand['p50_ms']:.4f} ms vs {base['p50_ms']:.4f} ms); allowed "
                 f"{opts.max_slowdown:g}x, failing only when the whole interval is above it",
                 slowdown.value, opts.max_slowdown,
                 [round(ci.low, 4), round(ci.high, 4)] if np.isfinite(ci.high) else None)


def _check_accuracy(metric: str, measured: dict[str, dict[str, float]],
                    replicates: dict[str, dict[str, np.ndarray]], opts: GateOptions) -> Check:
    if opts.max_accuracy_drop is None:
        return Check("accuracy", EXIT_ACCURACY, None, "no accuracy tolerance given")
    cand, base = measured["candidate"], measured["baseline"]
    if metric not in cand or metric not in base:
        raise InvalidInput(f"metric '{metric}' cannot be computed for these models and labels "
                           "(log loss and Brier need probability outputs; ROC AUC two classes)")
    direction = METRIC_DIRECTION[metric]
    drop = (base[metric] - cand[metric]) * direction
    reps = (replicates["baseline"][metric] - replicates["candidate"][metric]) * direction
    ci = interval(reps)
    ok = bool(drop <= opts.max_accuracy_drop)
    word = "worse" if drop > 0 else "better"
    return Check("accuracy", EXIT_ACCURACY, ok,
                 f"candidate {metric} {cand[metric]:.4f} vs baseline {base[metric]:.4f}: "
                 f"{abs(drop):.4f} {word} (95% interval of the drop {ci.low:+.4f} to "
                 f"{ci.high:+.4f}); allowed drop {opts.max_accuracy_drop:g}",
                 float(drop), opts.max_accuracy_drop, ci.to_list())


def _check_answers(task: str, outputs: dict[str, Outputs], y: np.ndarray | None,
                   opts: GateOptions, resamples: Resamples) -> Check:
    base, cand = outputs["baseline"], outputs["candidate"]
    if task != "classification" or base.labels is None or cand.labels is None:
        return _check_relative_error(base, cand, y, opts, resamples)
    if not opts.check_disagreement:
        return Check("disagreement", EXIT_DISAGREEMENT, None, "no disagreement limit given")
    changed = ~same_labels(cand.labels, base.labels)
    share = float(changed.mean())
    limit, why = opts.max_disagreement, "as set"
    if limit is None:
        if y is not None:
            error = float(1.0 - same_labels(base.labels, y).mean())
            limit = max(MIN_DISAGREEMENT, error)
            why = (f"default: the baseline's error rate {error:.2%} on these rows, at least "
                   f"{MIN_DISAGREEMENT:.0%}")
        else:
            limit, why = UNLABELED_DISAGREEMENT, "default without labels"
    ci = share_interval(changed, resamples)
    ok = share <= limit
    return Check("disagreement", EXIT_DISAGREEMENT, ok,
                 f"candidate answers differently from the baseline on {share:.2%} of rows "
                 f"(95% interval {ci.low:.2%} to {ci.high:.2%}); allowed {limit:.2%} ({why})",
                 share, limit, ci.to_list())


def _check_relative_error(base: Outputs, cand: Outputs, y: np.ndarray | None,
                          opts: GateOptions, resamples: Resamples) -> Check:
    """RMS(candidate - baseline) against the baseline's RMSE on these rows (with labels) or the
    spread of its answers (without): how far the answers moved, in units of how wrong or how
    varied they are."""
    if not opts.check_relative_error:
        return Check("relative_error", EXIT_DISAGREEMENT, None, "no answer-change limit")
    if cand.scores.shape != base.scores.shape:
        return Check("relative_error", EXIT_DISAGREEMENT, False,
                     f"candidate outputs {cand.scores.shape[1]} columns, the baseline "
                     f"{base.scores.shape[1]}", float("inf"), opts.max_relative_error)
    diff = answer_difference(base.scores, cand.scores)
    target = None if y is None else np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    if target is not None and target.shape[1] == base.scores.shape[1]:
        scale = float(np.sqrt(np.nanmean((base.scores - target) ** 2)))
        limit = MAX_ERROR_SHARE if opts.max_relative_error is None else opts.max_relative_error
        unit = "the baseline's RMSE on these rows"
    else:
        finite = base.scores[np.isfinite(base.scores).all(axis=1)]
        scale = float(np.sqrt(np.mean((finite - finite.mean(axis=0)) ** 2))) if finite.size \
            else 0.0
        limit = MAX_RELATIVE_ERROR if opts.max_relative_error is None else opts.max_relative_error
        unit = "the spread of the baseline's answers (RMS around their mean; no labels)"
    scale = scale or 1.0
    rows = MetricRows(per_row=np.mean(diff ** 2, axis=1), finish=np.sqrt)
    value = float(np.sqrt(np.mean(diff ** 2))) / scale
    ci = interval(resamples.replicates(rows) / scale)
    why = "as set" if opts.max_relative_error is not None else "default"
    return Check("relative_error", EXIT_DISAGREEMENT, bool(value <= limit),
                 f"candidate answers differ from the baseline's by {value:.2%} of {unit} "
                 f"(RMS of the difference; 95% interval {ci.low:.2%} to {ci.high:.2%}); "
                 f"allowed {limit:.2%} ({why})", value, limit, ci.to_list())
