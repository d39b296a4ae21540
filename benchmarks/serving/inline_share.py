"""Which path one-row V2 requests take (inline on the loop, or queued to the worker thread), and
what it costs in throughput: this tree against an older one, interleaved.

Why: the batcher runs a request at once on the event loop when it is idle and the run is
predicted shorter than ``batching.inline_max_us``; otherwise the run goes through the queue and
the model's worker thread. On a busy machine the demo forest's served run sits near the limit,
and a thread run is timed with its wait for the GIL afterwards, so without the batcher's probe
the estimate could stay above the limit and most requests take the thread path
(docs/architecture.md, "Findings that shape the hot path"). The share is read from the
servers' own ``/metrics`` (requests with a ``queue`` stage against all), so the mechanism is
measured, not inferred from throughput.

Both servers are pinned to CPU 0, the load (``redline bench``) to CPU 1; ``--hog`` adds a busy
loop on CPU 0 for the whole run, standing in for another tenant of a shared machine.

    .venv/bin/python benchmarks/serving/inline_share.py --model "$KIT/models/rf.onnx" \\
        --before <older tree>/src --rounds 3 [--hog]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import PY, ROOT, wait_http  # noqa: E402

CASES = (("grpc", 1), ("grpc", 8), ("json", 1), ("json", 8))
_COUNT = r'redline_stage_duration_seconds_count\{api="v2",model="rf",stage="%s",version="1"\} (\S+)'


def stage_counts(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for stage in ("inference", "queue"):
        found = re.findall(_COUNT % stage, text)
        out[stage] = float(found[0]) if found else 0.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="the demo forest's ONNX file")
    ap.add_argument("--before", required=True, type=Path, help="src/ of another redline tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--hog", action="store_true", help="a busy loop on the servers' CPU")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="redline-inline-"))
    subprocess.run([PY, "-c", "import sys; from redline.models import ModelRepository; "
                    "ModelRepository(sys.argv[2]).add_onnx('rf', sys.argv[1])",
                    str(args.model.resolve()), str(scratch / "repo")], check=True)
    trees = {"this tree": (ROOT / "src", 8400), "before": (args.before.resolve(), 8500)}
    procs = []
    rows: list[tuple[str, int, str, float, float]] = []
    try:
        if args.hog:
            procs.append(subprocess.Popen(["taskset", "-c", "0", PY, "-c", "while True: pass"]))
        ports = {}
        for name, (src, port) in trees.items():
            env = {**os.environ, "PYTHONPATH": str(src), "REDLINE_SCALING__WORKERS": "1"}
            procs.append(subprocess.Popen(
                ["taskset", "-c", "0", PY, "-m", "redline.cli", "serve", "--no-watch",
                 "--repository", str(scratch / "repo"), "--http-port", str(port),
                 "--grpc-port", str(port + 1)],
                env=env, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(port, "/v2/health/ready")
            ports[name] = port
        for _ in range(args.rounds):
            for protocol, c in CASES:
                for name, port in ports.items():
                    url = (f"127.0.0.1:{port + 1}" if protocol == "grpc"
                           else f"http://127.0.0.1:{port}")
                    before = stage_counts(port)
                    done = subprocess.run(
                        ["taskset", "-c", "1", PY, "-m", "redline.cli", "bench", "--url", url,
                         "--protocol", protocol, "--model", "rf", "--input", "X:FP32:1x30",
                         "-c", str(c), "--duration", str(args.duration), "--warmup", "0.2",
                         "--json"], capture_output=True, text=True, check=True)
                    time.sleep(1.2)  # the monitor's tick folds the flat stage times
                    after = stage_counts(port)
                    runs = max(1.0, after["inference"] - before["inference"])
                    rows.append((protocol, c, name, json.loads(done.stdout)["throughput_rps"],
                                 (after["queue"] - before["queue"]) / runs))
    finally:
        for p in procs:
            p.terminate()
    print(f"medians of {args.rounds} rounds of {args.duration} s" + (", CPU 0 hogged" if args.hog
                                                                    else ""))
    print("| protocol | c | tree | req/s | requests queued |\n| --- | --- | --- | --- | --- |")
    for protocol, c in CASES:
        for name in trees:
            sel = [r for r in rows if r[:3] == (protocol, c, name)]
            print(f"| {protocol} | {c} | {name} | {statistics.median(r[3] for r in sel):,.0f} | "
                  f"{statistics.median(r[4] for r in sel):.0%} |")


if __name__ == "__main__":
    main()
