"""Drift and quality reports for every version with live traffic: made on the tick's worker
thread, set into the Prometheus gauges, turned into alert conditions and the dashboard's brief.
"""

from __future__ import annotations

from typing import Any

from redline.errors import StoreUnavailable
from redline.monitoring.handoff import yield_to_loop
from redline.monitoring.prometheus import PrometheusExport
from redline.monitoring.windows import ModelWindows

Key = tuple[str, str]  # (model, version)


class VersionReports:
    """The latest drift and quality report per version, from ``windows``' monitors."""

    def __init__(self, windows: ModelWindows, export: PrometheusExport) -> None:
        self.windows = windows
        self.export = export
        self.drift: dict[Key, dict[str, Any]] = {}
        self.quality: dict[Key, dict[str, Any]] = {}

    def evaluate(self) -> None:
        """Drift and quality reports for every version with live traffic, into the gauges."""
        export = self.export
        for key, drift in list(self.windows.drift.items()):
            if not drift.has_reference and drift.prediction_ref is None:
                continue
            if not drift.calibrated:
                continue  # still calibrating in the background: the next evaluation reports
            if not drift.changed():
                continue  # no new rows: its last report and gauges stand
            report = drift.report()  # hands the GIL over between features (on the tick)
            self.drift[key] = report
            items = list(report["features"]) + ([report["prediction"]]
                                               if report["prediction"] else [])
            for n, f in enumerate(items):
                if n % 8 == 0:
                    yield_to_loop()  # ~40 label lookups a batch
                for stat, value in f.get("statistics", {}).items():
                    export.drift_score.labels(*key, f["feature"], stat).set(value)
                export.drift_alarm.labels(*key, f["feature"]).set(1 if f["drift"] else 0)
            yield_to_loop()
        for key, quality in list(self.windows.quality.items()):
            try:
                report = quality.report()
            except StoreUnavailable:
                continue  # a shared label join is down: the last report stands, routes say 503
            self.quality[key] = report
            for kind in ("realised", "estimated"):
                for metric, value in (report.get(kind) or {}).items():
                    if value is not None:
                        export.quality.labels(*key, metric, kind).set(value)
            for metric, value in report["reference"].items():
                export.quality.labels(*key, metric, "reference").set(value)
            export.quality_alarm.labels(*key).set(1 if report["alarm"] else 0)
            yield_to_loop()

    def conditions(self) -> dict[str, dict[str, Any]]:
        """The versions drifting or below their quality now, for the alert webhook."""
        out: dict[str, dict[str, Any]] = {}
        for (m, v), r in self.drift.items():
            if r["drift"]:
                out[f"drift:{m}:{v}"] = {"kind": "drift", "model": m, "version": v,
                                         "features": r["drifted"]}
        for (m, v), r in self.quality.items():
            if r["alarm"]:
                out[f"quality:{m}:{v}"] = {"kind": "quality", "model": m, "version": v,
                                           "metrics": r["alarms"], "realised": r["realised"],
                                           "reference": r["reference"]}
        return out

    def drifted(self) -> dict[str, Any]:
        """Per ``model:version`` the features that drifted, for the time series' point."""
        return {f"{m}:{v}": r["drifted"] for (m, v), r in self.drift.items()}

    def drift_briefs(self) -> dict[str, dict[str, Any]]:
        """Per ``model:version`` :func:`drift_brief` of its latest report."""
        return {f"{m}:{v}": drift_brief(r) for (m, v), r in self.drift.items()}


def drift_brief(report: dict[str, Any]) -> dict[str, Any]:
    """Per feature (and the prediction): the verdict, each statistic, its threshold and which
    went beyond (the dashboard ranks features by statistic over threshold)."""
    items = list(report["features"])
    if report.get("prediction"):
        items.append(report["prediction"])
    feats = {f["feature"]: {"drift": f["drift"], **f.get("statistics", {}),
                            "thresholds": f.get("thresholds", {}),
                            "beyond": f.get("beyond", [])} for f in items}
    return {"rows": report["window"]["rows"], "drifted": report["drifted"], "features": feats}
