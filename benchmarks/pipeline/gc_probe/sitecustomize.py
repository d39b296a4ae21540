"""A garbage-collection probe for a benchmark's server processes (not part of redline).

Put this folder first on ``PYTHONPATH`` and set ``GCPROBE_OUT``: every Python process whose
command line contains ``GCPROBE_MATCH`` (default ``redline.yaml``, i.e. the servers that
``feast_compare.py`` and ``bench_v1.py`` start) records each collection -- generation, wall and
thread-CPU time, objects collected -- and writes them as JSON to ``$GCPROBE_OUT.<pid>`` at
exit and every 2 s. With ``GCPROBE_YOUNG=1`` every 20th young collection also records what it is
about to walk (object types, the functions and coroutines by name, lists by first item and
length): that is how a per-request reference cycle shows itself (many live closures of requests
long answered).
That census distorts timings; leave it off when timing. ``gc_summary.py`` prints a summary.

    GCPROBE_OUT=/tmp/gc PYTHONPATH=benchmarks/pipeline/gc_probe:src:. \\
        .venv/bin/python benchmarks/pipeline/feast_compare.py ...
    .venv/bin/python benchmarks/pipeline/gc_summary.py /tmp/gc
"""

import os

_OUT = os.environ.get("GCPROBE_OUT")


def _install(out: str) -> None:
    import atexit
    import collections
    import gc
    import json
    import threading
    import time

    census = os.environ.get("GCPROBE_YOUNG") == "1"
    started = [0, 0]
    stats: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
    young: list[dict] = []
    seen = [0]
    cmd = open("/proc/self/cmdline").read().replace("\0", " ")[:300]

    def take_census() -> None:
        objs = gc.get_objects(0)
        kinds = collections.Counter(type(o).__qualname__ for o in objs)
        code = collections.Counter(getattr(o, "__qualname__", "?") for o in objs
                                   if type(o).__name__ in ("function", "coroutine"))
        # Only lists: a tuple may be under construction while the collector runs.
        lists = collections.Counter(f"{type(o[0]).__qualname__}/{len(o)}" for o in objs
                                    if type(o) is list and o)
        young.append({"objects": len(objs), "types": kinds.most_common(15),
                      "code": code.most_common(12), "lists": lists.most_common(10)})

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            if census and info["generation"] == 0:
                seen[0] += 1
                if seen[0] % 20 == 7:
                    take_census()
            started[0], started[1] = time.perf_counter_ns(), time.thread_time_ns()
        else:
            stats[info["generation"]].append((time.perf_counter_ns() - started[0],
                                              time.thread_time_ns() - started[1],
                                              info["collected"]))

    def dump() -> None:
        with open(f"{out}.{os.getpid()}", "w") as f:
            json.dump({"cmd": cmd, "columns": ["wall_ns", "cpu_ns", "collected"],
                       "collections": {str(g): v for g, v in stats.items()},
                       "young": young}, f)

    def every_two_seconds() -> None:  # a server killed by a signal skips atexit
        while True:
            time.sleep(2)
            dump()

    gc.callbacks.append(callback)
    atexit.register(dump)
    threading.Thread(target=every_two_seconds, name="gcprobe", daemon=True).start()


if _OUT and os.environ.get("GCPROBE_MATCH", "redline.yaml") in \
        open("/proc/self/cmdline").read():
    _install(_OUT)
