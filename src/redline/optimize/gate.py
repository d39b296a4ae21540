"""The CI gate: measure a candidate version and the baseline side by side, in one interleaved
run on the same rows, and fail with a readable reason (and a distinct exit code) when the
candidate breaks the latency budget, is slower than the baseline, less accurate, or answers
differently on too many rows.

Exit codes (stable, for CI scripts): 0 passed; 10 p99 over budget; 11 slower than the baseline;
12 accuracy dropped; 13 disagrees with the baseline; 2 a usage error (unknown model, bad data).
When several checks fail, the code is that of the first in the order above; every reason is
printed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.config import RuntimeSettings
from redline.errors import InvalidInput
from redline.models import ModelRepository
from redline.optimize.profile import (
    METRIC_DIRECTION,
    ModelRunner,
    compare_outputs,
    measure_latency,
    primary_metric,
    task_metrics,
)

EXIT_PASSED = 0
EXIT_P99 = 10
EXIT_SLOWDOWN = 11
EXIT_ACCURACY = 12
EXIT_DISAGREEMENT = 13


@dataclass
class GateOptions:
    p99_ms: float | None = None
    max_accuracy_drop: float | None = None  # absolute, in the metric's own units
    max_slowdown: float | None = 1.2  # candidate p50 / baseline p50
    max_disagreement: float | None = 0.01  # share of rows whose answer changes
    batch_size: int = 1
    rounds: int = 500
    max_seconds: float | None = 30.0
    metric: str | None = None


@dataclass
class Check:
    name: str
    exit_code: int
    passed: bool | None  # None: not requested
    message: str
    measured: float | None = None
    limit: float | None = None


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
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "candidate_version": self.candidate_version,
            "baseline_version": self.baseline_version, "baseline": self.baseline_ref,
            "metric": self.metric, "rows": self.rows, "batch_size": self.batch_size,
            "passed": self.passed, "exit_code": self.exit_code,
            "measured": {"candidate": self.candidate, "baseline": self.baseline},
            "checks": [c.__dict__ for c in self.checks],
        }

    def to_markdown(self) -> str:
        icon = "✅" if self.passed else "❌"
        lines = [
            f"### {icon} redline gate {'passed' if self.passed else 'failed'}: "
            f"`{self.model}` v{self.candidate_version} vs {self.baseline_ref} "
            f"(v{self.baseline_version})", "",
            f"Measured side by side in one interleaved run: {self.rows} rows, batch "
            f"{self.batch_size}.", "",
            "| | baseline | candidate |", "|---|---:|---:|",
            f"| p50 latency (ms) | {self.baseline['p50_ms']:.4f} | "
            f"{self.candidate['p50_ms']:.4f} |",
            f"| p99 latency (ms) | {self.baseline['p99_ms']:.4f} | "
            f"{self.candidate['p99_ms']:.4f} |",
            f"| {self.metric} | {self.baseline[self.metric]:.4f} | "
            f"{self.candidate[self.metric]:.4f} |",
            "", "| check | limit | measured | result |", "|---|---:|---:|---|",
        ]
        for c in self.checks:
            if c.passed is None:
                continue
            lines.append(f"| {c.name} | {_fmt(c.limit)} | {_fmt(c.measured)} | "
                         f"{'pass' if c.passed else '**FAIL**: ' + c.message} |")
        return "\n".join(lines) + "\n"

    def to_junit(self) -> str:
        suite = ET.Element("testsuite", name="redline-gate",
                           tests=str(sum(c.passed is not None for c in self.checks)),
                           failures=str(len(self.failures)), errors="0",
                           skipped=str(sum(c.passed is None for c in self.checks)))
        for c in self.checks:
            case = ET.SubElement(suite, "testcase", classname=f"redline.gate.{self.model}",
                                 name=c.name)
            if c.passed is None:
                ET.SubElement(case, "skipped", message="not requested")
            elif not c.passed:
                failure = ET.SubElement(case, "failure", message=c.message,
                                        type=f"exit-{c.exit_code}")
                failure.text = c.message
            else:
                ET.SubElement(case, "system-out").text = c.message
        root = ET.Element("testsuites")
        root.append(suite)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _load(repo: ModelRepository, name: str, ref: str | int | None) -> tuple[int, bytes]:
    meta = repo.verify(name, ref)  # checks the file against its recorded sha256
    return meta.version, repo.model_path(name, meta.version).read_bytes()


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
    meta = repo.metadata(name, candidate)
    cand_version, cand_bytes = _load(repo, name, candidate)
    base_version, base_bytes = _load(repo, name, baseline)
    runners = {
        "baseline": ModelRunner(base_bytes, task=meta.task, class_labels=meta.class_labels,
                                settings=settings, name=f"{name} v{base_version}"),
        "candidate": ModelRunner(cand_bytes, task=meta.task, class_labels=meta.class_labels,
                                 settings=settings, name=f"{name} v{cand_version}"),
    }
    width = runners["candidate"].n_features
    if width is not None and x.shape[1] != width:
        raise InvalidInput(f"the data has {x.shape[1]} features per row but model '{name}' "
                           f"v{cand_version} expects {width}; pass rows with the model's features")
    metric = primary_metric(meta.task, opts.metric)
    if opts.max_accuracy_drop is not None and y is None:
        raise InvalidInput("--max-accuracy-drop needs labels: pass --data with a label column")
    outputs = {k: r.predict(x) for k, r in runners.items()}
    measured: dict[str, dict[str, float]] = {}
    for key, out in outputs.items():
        measured[key] = task_metrics(meta.task, out, y, meta.class_labels) if y is not None else {}
        measured[key].setdefault(metric, float("nan"))
    latency = measure_latency(runners, x, [opts.batch_size], rounds=opts.rounds,
                              max_seconds=opts.max_seconds)
    for key in runners:
        lat = latency[key][opts.batch_size]
        measured[key].update(p50_ms=lat.p50_us / 1000, p99_ms=lat.p99_us / 1000)
    diff = compare_outputs(meta.task, outputs["baseline"], outputs["candidate"])
    cand, base = measured["candidate"], measured["baseline"]
    result = GateResult(name, cand_version, base_version, str(baseline), metric, len(x),
                        opts.batch_size, cand, base)
    result.checks = [
        _check_p99(cand, opts), _check_slowdown(cand, base, opts),
        _check_accuracy(metric, cand, base, opts), _check_disagreement(diff, opts),
    ]
    return result


def _check_p99(cand: dict[str, float], opts: GateOptions) -> Check:
    if opts.p99_ms is None:
        return Check("p99_budget", EXIT_P99, None, "no p99 budget given")
    ok = cand["p99_ms"] <= opts.p99_ms
    verb = "within" if ok else "over"
    return Check("p99_budget", EXIT_P99, ok,
                 f"candidate p99 {cand['p99_ms']:.4f} ms is {verb} the {opts.p99_ms:g} ms budget"
                 f" (batch {opts.batch_size})", cand["p99_ms"], opts.p99_ms)


def _check_slowdown(cand: dict[str, float], base: dict[str, float], opts: GateOptions) -> Check:
    if opts.max_slowdown is None:
        return Check("slowdown", EXIT_SLOWDOWN, None, "no slowdown limit given")
    ratio = cand["p50_ms"] / max(base["p50_ms"], 1e-9)
    ok = ratio <= opts.max_slowdown
    return Check("slowdown", EXIT_SLOWDOWN, ok,
                 f"candidate median latency is {ratio:.2f}x the baseline's "
                 f"({cand['p50_ms']:.4f} ms vs {base['p50_ms']:.4f} ms); allowed "
                 f"{opts.max_slowdown:g}x", ratio, opts.max_slowdown)


def _check_accuracy(metric: str, cand: dict[str, float], base: dict[str, float],
                    opts: GateOptions) -> Check:
    if opts.max_accuracy_drop is None:
        return Check("accuracy", EXIT_ACCURACY, None, "no accuracy tolerance given")
    drop = (base[metric] - cand[metric]) * METRIC_DIRECTION[metric]
    ok = bool(drop <= opts.max_accuracy_drop)
    word = "worse" if drop > 0 else "better"
    return Check("accuracy", EXIT_ACCURACY, ok,
                 f"candidate {metric} {cand[metric]:.4f} vs baseline {base[metric]:.4f}: "
                 f"{abs(drop):.4f} {word}; allowed drop {opts.max_accuracy_drop:g}",
                 float(drop), opts.max_accuracy_drop)


def _check_disagreement(diff: dict[str, float], opts: GateOptions) -> Check:
    if opts.max_disagreement is None:
        return Check("disagreement", EXIT_DISAGREEMENT, None, "no disagreement limit given")
    share = diff["disagreement"]
    ok = share <= opts.max_disagreement
    return Check("disagreement", EXIT_DISAGREEMENT, ok,
                 f"candidate answers differently from the baseline on {share:.2%} of rows "
                 f"(largest output difference {diff['max_abs_diff']:.3g}); allowed "
                 f"{opts.max_disagreement:.2%}", share, opts.max_disagreement)
