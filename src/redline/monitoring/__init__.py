"""Observability: Prometheus metrics, traces, the slow-request log, drift, live quality, review,
alerts and the live dashboard, all fed by the finished ``RequestRecord`` of every request.

The server builds one :class:`ServerMonitor`, adds its ``observers()`` to the serving
``Observers`` and its routes to the REST app; nothing here runs on a request's path beyond
folding its record into counters.
"""

from redline.monitoring.drift import DriftMonitor
from redline.monitoring.metrics import RequestMetrics, SlowLog, latency_buckets
from redline.monitoring.monitor import ServerMonitor
from redline.monitoring.quality import QualityMonitor, cbpe
from redline.monitoring.review import ReviewQueue

__all__ = ["DriftMonitor", "QualityMonitor", "RequestMetrics", "ReviewQueue", "ServerMonitor",
           "SlowLog", "cbpe", "latency_buckets"]
