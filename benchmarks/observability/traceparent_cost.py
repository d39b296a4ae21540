"""What naming a response's trace costs on the request path: ``TraceExport.response_traceparent``
on a finished record, with a new trace (no caller ``traceparent``, unsampled: the common case)
and with a caller's trace, in microseconds per call (best of 7 repeats).

Run it against two trees for a before/after (alternate the runs; the machine is noisy)::

    PYTHONPATH=src .venv/bin/python benchmarks/observability/traceparent_cost.py after
    PYTHONPATH="$BEFORE/src" .venv/bin/python benchmarks/observability/traceparent_cost.py before
"""

from __future__ import annotations

import sys
import timeit

from redline.monitoring.tracing import TraceExport
from redline.serving.stages import RequestRecord


class _NoSink:
    def send(self, payload: bytes) -> None:
        pass


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this tree"
    tracing = TraceExport(_NoSink(), sample_ratio=0.01, slow_ms=100.0, fed_by_monitor=True)
    new = RequestRecord("v2", "rest")
    new.model = "m"
    new.finish()
    caller = RequestRecord("v2", "rest")
    caller.model = "m"
    caller.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    caller.finish()
    tracing.response_traceparent(new)  # learns the model's slow threshold
    for name, record in (("new trace", new), ("caller's trace", caller)):
        best = min(timeit.repeat(lambda r=record: tracing.response_traceparent(r),  # type: ignore[misc]
                                 number=200_000, repeat=7))
        print(f"{label}: {name}: {best / 200_000 * 1e6:.3f} us per call")
    tracing.close()


if __name__ == "__main__":
    main()
