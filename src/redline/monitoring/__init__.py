"""Observability: Prometheus metrics, traces, the slow-request log, drift, live quality, review,
alerts and the live dashboard, all fed by the finished ``RequestRecord`` of every request.

A serving ``RedlineServer`` that monitors is built with :class:`ServerMonitor` as its
``monitoring`` (``redline.assembly`` does this): its observer joins the server's ``Observers``,
its routes the REST app, and it lives as the server's companion. Monitoring
imports serving's types; serving never imports monitoring. Nothing here runs on a request's
path beyond keeping its record or its stage times.
"""

from redline.monitoring.buckets import latency_buckets
from redline.monitoring.drift import DriftMonitor
from redline.monitoring.metrics import RequestMetrics
from redline.monitoring.monitor import ServerMonitor
from redline.monitoring.quality import QualityMonitor, cbpe
from redline.monitoring.review import ReviewQueue
from redline.monitoring.slowlog import SlowLog

__all__ = ["DriftMonitor", "QualityMonitor", "RequestMetrics", "ReviewQueue", "ServerMonitor",
           "SlowLog", "cbpe", "latency_buckets"]
