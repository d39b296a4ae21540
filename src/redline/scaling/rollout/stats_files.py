"""The counts each process writes beside the rollout file, and their sums over processes.

Each process writes its own counts to ``<file>.stats/<instance>.json`` once a second (with a
latency histogram and a sample of its answers). A process adds the others' files to its own
live counts before it decides, and ``redline rollout status`` adds them all up; either way a
file written during an earlier rollout of the same model is left out.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from redline.scaling.rollout.answers import MergedAnswers, compare_answers
from redline.scaling.rollout.spec import RolloutFile, RolloutSpec
from redline.scaling.rollout.stats import MergedStats, histogram_p99_ms

# The other processes' sums: counts and answers per version, (compared, mismatched) per shadow.
PeerCounts = tuple[dict[tuple[str, int], MergedStats], dict[tuple[str, int], MergedAnswers],
                   dict[str, tuple[int, int]]]


def current_models(doc: dict[str, Any], rollouts: dict[str, RolloutSpec]) -> set[str]:
    """The models whose counts in a stats file belong to the rollout running now (a file
    written during an earlier rollout of the same model carries that one's start)."""
    started = doc.get("started", {})
    return {m for m, spec in rollouts.items() if started.get(m) == spec.started}


def write_stats_file(folder: Path, instance: str, doc: dict[str, Any]) -> None:
    """This process's counts, replaced atomically (a folder that cannot be written is
    skipped: the others decide on what they have)."""
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{instance}.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(folder / f"{instance}.json")


def read_peers(folder: Path, instance: str, rollouts: dict[str, RolloutSpec]) -> PeerCounts:
    """Every other process's counts for the rollouts running now, summed: per version, the
    answers per version, and per shadowed model (compared, mismatched)."""
    peers: dict[tuple[str, int], MergedStats] = {}
    answers: dict[tuple[str, int], MergedAnswers] = {}
    shadow: dict[str, tuple[int, int]] = {}
    try:
        paths = [p for p in folder.glob("*.json") if p.stem != instance]
    except OSError:
        paths = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced, or gone: the next read will have it
        current = current_models(doc, rollouts)
        for key, s in doc.get("versions", {}).items():
            model, _, version = key.rpartition(":")
            if model in current:
                merged = peers.setdefault((model, int(version)), MergedStats())
                merged.add(int(s["requests"]), int(s["errors"]),
                           {int(b): int(c) for b, c in s.get("hist", {}).items()},
                           s.get("refused"))
        for key, part in doc.get("answers", {}).items():
            model, _, version = key.rpartition(":")
            if model in current:
                answers.setdefault((model, int(version)), MergedAnswers()).add_doc(part)
        for model, s in doc.get("shadow", {}).items():
            if model in current:
                compared, mismatched = shadow.get(model, (0, 0))
                shadow[model] = (compared + int(s.get("compared", 0)),
                                 mismatched + int(s.get("mismatched", 0)))
    return peers, answers, shadow


def aggregate_stats(file: RolloutFile, max_age_s: float = 30.0,
                    rollouts: dict[str, RolloutSpec] | None = None) -> dict[str, Any]:
    """Per-version counts of each model's latest rollout, added up over every process that
    wrote recently (a file's counts of an earlier rollout of the same model are left out),
    and each rollout's answers compared."""
    if rollouts is None:
        rollouts = file.read()
    versions: dict[str, dict[str, Any]] = {}
    shadow: dict[str, dict[str, Any]] = {}
    labels: dict[str, dict[str, dict[str, Any]]] = {}
    hists: dict[str, dict[int, int]] = {}
    answers: dict[str, MergedAnswers] = {}
    processes = 0
    now = time.time()
    for path in sorted(file.stats_dir.glob("*.json")) if file.stats_dir.exists() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if now - doc.get("time", 0) > max_age_s:
            continue
        processes += 1
        current = current_models(doc, rollouts)
        for key, s in doc.get("versions", {}).items():
            if key.rpartition(":")[0] not in current:
                continue
            into = versions.setdefault(key, {"requests": 0, "errors": 0, "p99_ms": 0.0,
                                             "refused": {}})
            into["requests"] += s["requests"]
            into["errors"] += s["errors"]
            for code, count in s.get("refused", {}).items():
                into["refused"][code] = into["refused"].get(code, 0) + int(count)
            into["p99_ms"] = max(into["p99_ms"], s["p99_ms"])  # worst process, unless merged
            hist = hists.setdefault(key, {})
            for bucket, count in s.get("hist", {}).items():
                hist[int(bucket)] = hist.get(int(bucket), 0) + int(count)
        for key, part in doc.get("answers", {}).items():
            if key.rpartition(":")[0] in current:
                answers.setdefault(key, MergedAnswers()).add_doc(part)
        for key, s in doc.get("shadow", {}).items():
            if key not in current:
                continue
            into = shadow.setdefault(key, {})
            for k, v in s.items():
                into[k] = max(into.get(k, 0), v) if k in ("max_abs_diff", "candidate_p99_ms") \
                    else into.get(k, 0) + v
        for model, per_version in doc.get("labels", {}).items():
            if model in current:  # labels are judged per process: the largest sample shows
                for version, loss in per_version.items():
                    shown = labels.setdefault(model, {}).get(version)
                    if shown is None or loss["labelled"] > shown["labelled"]:
                        labels[model][version] = loss
    for key, s in versions.items():
        s["error_rate"] = round(s["errors"] / s["requests"], 4) if s["requests"] else 0.0
        if hists.get(key):
            s["p99_ms"] = round(histogram_p99_ms(hists[key]), 3)  # of the merged latencies
    compared: dict[str, Any] = {}
    for name, spec in rollouts.items():
        base = answers.get(f"{name}:{spec.baseline}")
        cand = answers.get(f"{name}:{spec.candidate}")
        if base is not None and cand is not None:
            compared[name] = compare_answers(spec, base, cand)
    return {"processes": processes, "versions": versions, "shadow": shadow,
            "answers": compared, "labels": labels}
