"""Canary and shadow rollouts of a candidate model version, with automatic rollback.

The rollout of a model is a small JSON document in ``scaling.rollout_file`` (written by
``redline rollout start|promote|abort``). Every server process polls it (a ``stat`` at most
twice a second, from the request path) so all workers and replicas sharing the project folder
follow the same rollout, and a rollback decided by one is seen by all.

- **canary**: ``percent`` of the model's default-version traffic goes to the candidate, chosen
  at random per request, or *sticky* by entity key for ``/v1`` (the same entity always sees the
  same version: a stable hash of its keys). Each process counts per version: requests, server
  errors and latency; a client's mistake (invalid input, an unknown feature) counts against
  neither version, but each version's refusals are counted by code. Once both versions have
  ``min_requests``, the candidate is rolled back when its error rate exceeds the baseline's by
  ``max_error_rate_delta``, when it refuses a kind of request the baseline serves (its rate of
  a refusal code exceeds the baseline's on the same traffic by ``max_error_rate_delta`` and by
  more than chance: a ``/v1`` candidate that cannot assemble its input answers every request
  400), or when its p99 exceeds the baseline's by ``max_p99_ratio`` (and by at least
  ``min_p99_delta_ms``, so a sub-millisecond jitter is not a regression).
- **shadow**: every (or ``percent`` of) baseline request is run again on the candidate after
  the response is done, off the critical path (its own ORT thread, bounded concurrency: when
  more than ``shadow_max_in_flight`` are running a copy is dropped, never queued). Outputs are
  compared (``numpy.allclose`` within ``answer_rtol``/``answer_atol``) and latencies recorded;
  the response never changes.

Errors and latency do not show a candidate that answers wrongly (a constant, a rescaled score),
so a rollout judges the answers too: each output's distribution against the baseline's on the
same traffic, a shadow's mismatch rate, and the loss against labels where they arrive. While a
rollout runs, both versions keep every request's arrays (``handle.shadowed``) for it. Every
check has a bound with a default in ``scaling.rollout_*`` and waits for a minimum sample;
crossing one rolls back, with the reason in the rollout file (``redline rollout status``), one
WARNING line in the log and ``redline_rollout_rollbacks_total{model, check}``.

Per-version counts are kept per process, and each process writes them beside the rollout file
(``<file>.stats/<pid>.json``, with a latency histogram) once a second. The rollback decision is
taken on the sum over every process of the rollout - this one's live counts plus the others'
files (read at most twice a second): with ``redline serve --workers N`` the workers decide on
the same numbers, ``min_requests`` means requests to the service rather than to one worker,
the p99 is the p99 of the merged histograms (5% buckets), and whichever worker first sees the
sum cross a threshold writes the rollback that every worker then follows. ``redline rollout
status`` shows the same sums. The Prometheus metrics (``monitoring``) carry the same requests
labelled by version.

The modules, from the bottom up:

- ``spec.py``: ``RolloutSpec`` and the rollout file;
- ``stats.py``: per-version counts and latency histograms, one process's and their sums;
- ``verdict.py``: whether errors, refusals or latency condemn a candidate, and whether a
  candidate can serve its baseline's requests at all;
- ``answers.py``: what the answers themselves say (predictions, mismatch, labels);
- ``labels.py``: the labels joined since a rollout began;
- ``stats_files.py``: the counts each process writes, and their sums over processes;
- ``shadow.py``: a shadow's copies, off the critical path;
- ``controller.py``: ``RolloutController``, one per process: route, count, judge, roll back;
- ``install.py``: a server that follows the rollout file.
"""

from __future__ import annotations

from redline.scaling.rollout.answers import AnswerSample, MergedAnswers
from redline.scaling.rollout.controller import (
    ANSWERS_EVERY,
    LABELS_EVERY_S,
    RolloutController,
    sticky_share,
)
from redline.scaling.rollout.install import RolloutTicker, install
from redline.scaling.rollout.labels import LabelSource
from redline.scaling.rollout.spec import ACTIVE, RolloutFile, RolloutSpec, rollout_path
from redline.scaling.rollout.stats import MergedStats, ShadowStats, VersionStats
from redline.scaling.rollout.stats_files import aggregate_stats
from redline.scaling.rollout.verdict import (
    CLIENT_ERRORS,
    JUDGED_REFUSALS,
    decide_rollback,
    refused_only_by_candidate,
    service_verdict,
    unservable_candidate,
)

__all__ = [
    "ACTIVE",
    "ANSWERS_EVERY",
    "CLIENT_ERRORS",
    "JUDGED_REFUSALS",
    "LABELS_EVERY_S",
    "AnswerSample",
    "LabelSource",
    "MergedAnswers",
    "MergedStats",
    "RolloutController",
    "RolloutFile",
    "RolloutSpec",
    "RolloutTicker",
    "ShadowStats",
    "VersionStats",
    "aggregate_stats",
    "decide_rollback",
    "install",
    "refused_only_by_candidate",
    "rollout_path",
    "service_verdict",
    "sticky_share",
    "unservable_candidate",
]
