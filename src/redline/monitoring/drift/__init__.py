"""Drift that tells a shift from noise: effect sizes against the version's reference profile.

Every model version carries a profile of its training inputs (``metadata.input_profile``: per
feature quantiles, a decile histogram, the missing share and, for low-cardinality integer
columns, category shares). The server keeps a bounded rolling window of live rows per version and
compares each feature with its profile:

- PSI and Jensen-Shannon distance (base 2) over the profile's bins, for every feature;
- Wasserstein-1 distance (1% tails trimmed) in reference standard deviations, for numeric ones;
- category shares (and the share of categories never seen in training), for categorical ones;
- the missing-value rate and the out-of-range rate (outside the training min..max).

No p-values: a test's p-value shrinks with the sample, so a large window of unchanged data
alarms on differences too small to matter. Instead each statistic has a threshold that is an
*effect size*: the larger of a floor (a shift small enough to ignore) and the 99.9th percentile
of the statistic on windows of the same size drawn from the reference profile itself (the
statistic's own noise at that size). So a small window does not alarm on noise and a large one
does not alarm on a trivial difference.

One module per idea: ``stats`` (the statistics: shares, rates, PSI, Jensen-Shannon),
``reference`` (a feature's training distribution), ``calibration`` (thresholds from the
reference's own noise), ``window`` (the live rows) and ``monitor`` (one version's monitor).
"""

from redline.monitoring.drift.calibration import (
    CALIBRATION_CONSTANTS,
    JS_FLOOR,
    NULL_CHUNK,
    NULL_DRAWS,
    NULL_QUANTILE,
    PSI_FLOOR,
    RATE_FLOOR,
    W_CHUNK,
    W_DRAWS,
    W_QUANTILE,
    WASSERSTEIN_FLOOR,
    CalibrationStopped,
    size_classes,
)
from redline.monitoring.drift.monitor import DriftMonitor
from redline.monitoring.drift.reference import FeatureReference
from redline.monitoring.drift.stats import Rate, Shares, js_distance, psi
from redline.monitoring.drift.window import RollingWindow

__all__ = [
    "CALIBRATION_CONSTANTS", "JS_FLOOR", "NULL_CHUNK", "NULL_DRAWS", "NULL_QUANTILE", "PSI_FLOOR",
    "RATE_FLOOR", "WASSERSTEIN_FLOOR", "W_CHUNK", "W_DRAWS", "W_QUANTILE", "CalibrationStopped",
    "DriftMonitor", "FeatureReference", "Rate", "RollingWindow", "Shares", "js_distance", "psi",
    "size_classes",
]
