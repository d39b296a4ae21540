"""Which candidate becomes the next version, if any, and why.

The pick is made on the choice rows and confirmed on the evaluation rows; a speed-up counts
only by the lower end of its interval, paired pass by pass, so noise never picks a version.
"""

from __future__ import annotations

from redline.optimize.options import OptimizeOptions
from redline.optimize.results import CandidateResult, Judgement, OptimizeReport
from redline.optimize.speed import Ratio, latency_ratio

# Two candidates are reported as different speeds only when one is faster than the other by at
# least this much, by the lower end of their paired interval (or by --min-speedup, if larger).
DISTINCT_SPEED = 1.05


def choose(report: OptimizeReport, opts: OptimizeOptions) -> CandidateResult | None:
    """The fastest candidate within tolerance on the choice rows (by its interval) whose
    speed-up clears ``min_speedup`` by the lower end of its paired interval, if the evaluation
    rows confirm it; sets ``report.chosen`` and ``report.reason``.

    Candidates the measurement cannot tell apart from the fastest (their paired ratio to it
    does not clear ``max(min_speedup, DISTINCT_SPEED)``) are marked as tied with it, and the
    pick among them is the smallest, then the one changing the fewest runtime settings: noise
    must not decide which of several equal candidates becomes the next version."""
    batch = max(report.batch_sizes)
    q = 50.0 if opts.rank_by == "p50" else 99.0
    original = report.result("original")
    gains = {r.name: _speedup(original, r, batch, q) for r in report.results}
    eligible = [r for r in report.results if r.name != "original" and r.within_tolerance]
    if not eligible:
        uncertain = [r.name for r in report.results if r.verdict == "uncertain"]
        report.reason = (f"no candidate is within {report.tolerance:.2%} relative "
                         f"{report.metric} loss by the worse end of its 95% interval on the "
                         f"{report.rows['choice']} choice rows; the original stays")
        if uncertain:
            report.reason += (f" ({', '.join(uncertain)} look close, but the data are too few "
                              "to tell: pass more rows)")
        guarded = [r.name for r in report.results if r.verdict == "guard"]
        if guarded:
            report.reason += (f"; {', '.join(guarded)} stay within the {report.metric} "
                              f"tolerance but worsen {report.guard_metric} by more than "
                              f"{opts.guard_tolerance:.0%} (--guard-tolerance)")
        return None
    fastest = max(eligible, key=lambda r: gains[r.name].value)
    distinct = max(opts.min_speedup, DISTINCT_SPEED)
    for r in eligible:
        if r is not fastest and not _speedup(r, fastest, batch, q).clears(distinct):
            r.tied_with = fastest.name
    clearing = [r for r in eligible if gains[r.name].clears(opts.min_speedup)]
    if not clearing:
        report.reason = (f"the fastest candidate within tolerance ({fastest.name}) has a "
                         f"speed-up of {gains[fastest.name].text()} ({opts.rank_by}) at batch "
                         f"{batch}; registering needs the interval's lower end to reach "
                         f"{opts.min_speedup:.2f}x (--min-speedup), so no faster version is "
                         "shown beyond the machine's noise: the original stays")
        return None
    best = max(clearing, key=lambda r: gains[r.name].value)
    tied = [best] + [r for r in clearing if r is not best
                     and not _speedup(r, best, batch, q).clears(distinct)]
    best = min(tied, key=lambda r: (r.size_bytes, len(r.settings), r.name))
    for r in eligible:
        r.tied_with = None if r is best else (
            best.name if r in tied else r.tied_with)
    ev = best.evaluation
    confirmed = ev.interval.high <= opts.tolerance and (
        report.guard_metric is None or (ev.guard_interval is not None and
                                        ev.guard_interval.high <= opts.guard_tolerance))
    if not confirmed:
        report.reason = (f"{best.name} was picked on the choice rows, but on the "
                         f"{report.eval_rows} evaluation rows its relative {report.metric} loss "
                         f"is {ev.loss:+.2%} (95% interval {ev.interval.low:+.2%} to "
                         f"{ev.interval.high:+.2%})" + _guard_text(report, ev) +
                         f": not confirmed within {report.tolerance:.2%}"
                         + (f" / {report.guard_metric} within {opts.guard_tolerance:.2%}"
                            if report.guard_metric else "")
                         + " — the data are too few or the candidate too lossy; the original "
                         "stays")
        return None
    report.chosen = best.name
    others = [r.name for r in tied if r is not best]
    report.reason = (f"{best.name}: {gains[best.name].text()} faster ({opts.rank_by}) at batch "
                     f"{batch}; on the evaluation rows relative {report.metric} loss "
                     f"{ev.loss + 0.0:+.2%} (95% interval {ev.interval.low:+.2%} to "
                     f"{ev.interval.high:+.2%})" + _guard_text(report, ev)
                     + (f"; as fast within noise: {', '.join(others)} (the smallest, with the "
                        "fewest runtime settings changed, is chosen)" if others else ""))
    return best


def _speedup(slow: CandidateResult, fast: CandidateResult, batch: int, q: float) -> Ratio:
    """How many times faster ``fast`` is than ``slow``, paired pass by pass."""
    return latency_ratio(slow.latency[batch], fast.latency[batch], q)


def _guard_text(report: OptimizeReport, ev: Judgement) -> str:
    if report.guard_metric is None or ev.guard_interval is None or ev.guard_loss is None:
        return ""
    return (f", {report.guard_metric} loss {ev.guard_loss + 0.0:+.2%} (interval "
            f"{ev.guard_interval.low:+.2%} to {ev.guard_interval.high:+.2%})")
