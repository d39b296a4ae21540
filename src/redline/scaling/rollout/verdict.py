"""Whether a candidate's errors, refusals or latency condemn it, and whether it can serve at all.

Every check waits for ``min_requests`` on both versions, and a difference must be larger than
chance on that many requests before it rolls a candidate back. The answers themselves are
judged in ``answers.py``.
"""

from __future__ import annotations

import math
from typing import Any

from redline.scaling.rollout.spec import RolloutSpec
from redline.scaling.rollout.stats import MergedStats, VersionStats, share_over

# Request outcomes that are the client's doing: they never count against a version...
CLIENT_ERRORS = frozenset({"invalid_input", "payload_too_large", "not_found", "model_not_found",
                           "version_not_found", "feature_not_found", "unauthorized",
                           "overloaded"})
# ...unless the candidate answers one of these more often than the baseline on the same
# traffic: then it refuses requests the baseline serves (overload is the latency check's).
JUDGED_REFUSALS = frozenset({"invalid_input", "payload_too_large", "feature_not_found"})


def service_verdict(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                    candidate: VersionStats | MergedStats) -> tuple[str, str] | None:
    """(check, reason) when errors or latency condemn the candidate, else None (also while
    there is too little data)."""
    refusing = refused_only_by_candidate(spec, baseline, candidate)
    if refusing is not None:
        return "errors", refusing
    if candidate.requests < spec.min_requests or baseline.requests < spec.min_requests:
        return None
    if candidate.error_rate > baseline.error_rate + spec.max_error_rate_delta:
        return "errors", (f"error rate {candidate.error_rate:.1%} vs baseline "
                          f"{baseline.error_rate:.1%} over {candidate.requests} requests")
    c99, b99 = candidate.p99_ms(), baseline.p99_ms()
    if c99 > b99 * spec.max_p99_ratio and c99 - b99 > spec.min_p99_delta_ms:
        # The p99 of a few hundred requests is their second or third slowest: a scheduler
        # hiccup moves it. So the candidate must also be slow often enough to tell: the share
        # of its requests beyond the bound, against the 1% a same-speed version has there.
        bound_ms = max(b99 * spec.max_p99_ratio, b99 + spec.min_p99_delta_ms)
        hist = candidate.hist if isinstance(candidate, MergedStats) else candidate.histogram()
        share, n = share_over(hist, bound_ms)
        if share > 0.01 + 4.0 * math.sqrt(0.01 * 0.99 / max(1, n)):
            return "latency", (f"p99 {c99:.2f} ms vs baseline {b99:.2f} ms: {share:.1%} of "
                               f"{n} candidate requests slower than {bound_ms:.2f} ms")
    return None


def refused_only_by_candidate(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                              candidate: VersionStats | MergedStats) -> str | None:
    """Why the candidate refuses requests the baseline serves, or None: a refusal that the
    client caused comes as often to both versions (they share the traffic), so a code the
    candidate answers more often, by ``max_error_rate_delta`` and by more than chance (four
    standard errors of the difference), is the candidate's failure, not the client's."""
    n_c, n_b = candidate.seen, baseline.seen
    if n_c < spec.min_requests or n_b < spec.min_requests:
        return None
    for code in sorted(JUDGED_REFUSALS & candidate.refused.keys()):
        k_c, k_b = candidate.refused[code], baseline.refused.get(code, 0)
        p_c, p_b = k_c / n_c, k_b / n_b
        pooled = (k_c + k_b) / (n_c + n_b)
        chance = 4.0 * math.sqrt(pooled * (1 - pooled) * (1 / n_c + 1 / n_b))
        if p_c - p_b > max(spec.max_error_rate_delta, chance):
            return (f"'{code}' answers {p_c:.1%} of {n_c} requests vs baseline {p_b:.1%}: the "
                    "candidate refuses requests the baseline serves")
    return None


def decide_rollback(spec: RolloutSpec, baseline: VersionStats | MergedStats,
                    candidate: VersionStats | MergedStats) -> str | None:
    """Why errors or latency condemn the candidate, or None."""
    verdict = service_verdict(spec, baseline, candidate)
    return None if verdict is None else verdict[1]


def unservable_candidate(baseline: Any, candidate: Any, mode: str,
                         v2_only: bool = False) -> str | None:
    """Why a candidate (a version's ``ModelMetadata``) cannot serve the requests its baseline
    serves, or None: checked before a rollout starts, since every request such a candidate
    got would be refused (400), and refusals look like the client's mistakes."""
    name, b, c = baseline.name, baseline.version, candidate.version
    b_inputs = sorted(t.name for t in baseline.inputs)
    c_inputs = sorted(t.name for t in candidate.inputs)
    if b_inputs and c_inputs and b_inputs != c_inputs:
        return (f"version {c} of '{name}' takes the inputs {c_inputs}, version {b} takes "
                f"{b_inputs}: requests name the baseline's inputs, so the candidate would "
                "refuse them; a model with other inputs is a new model (or a version clients "
                "move to together), not a canary")
    if mode != "canary" or v2_only or not baseline.feature_names:
        return None  # a shadow replays the baseline's arrays; V2 needs no feature names
    if not candidate.feature_names:
        why = "records no feature_names"
    elif len(candidate.inputs) != 1 or len(candidate.inputs[0].shape) != 2:
        why = "does not take one 2-D input [rows, features]"
    else:
        return None
    return (f"version {c} of '{name}' {why}, while version {b} serves /v1 with "
            f"{len(baseline.feature_names)} feature names: the candidate cannot assemble a /v1 "
            "request's input, and every /v1 request sent to it would answer 400; add it again "
            f"with --feature-names (version {b}'s: `redline models show -m {name}`), or pass "
            f"--v2-only when '{name}' serves no /v1 requests")
