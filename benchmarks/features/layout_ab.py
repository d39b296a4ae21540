"""Ingest cost split into Python (decode + write arguments) and Lua (Redis INFO commandstats).

    PYTHONPATH=src:. .venv/bin/python -m benchmarks.features.layout_ab [events]

Drains a pre-filled Redis Stream with one StreamConsumer (1 view, then 5 views / 40 features)
and prints events/s, Python us/event and Lua us/event (EVALSHA time inside Redis / events).
Run it with each checkout's ``src`` first on ``PYTHONPATH``, one after the other, to compare
layouts.
"""
import json
import sys
import time

import redis

from benchmarks.features.common import forty_features, start_redis
from benchmarks.features.ingest_bench import drain, fill, one_view, payload
from redline.features.events import EventDecoder
from redline.features.online import redis as R

RedisStore = R.RedisStore

n = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
proc, url = start_redis()
c = redis.Redis.from_url(url)
try:
    for name, defs in (("1v", one_view()), ("5v", forty_features())):
        # decode-only cost
        dec = EventDecoder(defs)
        now = int(time.time()*1000)
        raws = [payload(i, now) for i in range(n)]
        t0 = time.perf_counter()
        for s in range(0, n, 1000):
            b = dec.decode(raws[s:s+1000], now)
            a = R.write_call(b, ("0",)) if hasattr(R, "write_call") else R.write_args(b)
        td = time.perf_counter() - t0
        c.config_resetstat()
        stream = f"s:{name}"
        fill(url, stream, n)
        c.config_resetstat()
        dt = drain(defs, url, stream, n, 1000)
        st = c.info("commandstats")
        ev = st.get("cmdstat_evalsha") or st.get("cmdstat_eval")
        print(name, json.dumps({"ev_per_s": round(n/dt), "decode+args_us_per_ev": round(td/n*1e6,1),
              "lua_us_per_ev": round(ev["usec"]/n, 1), "lua_calls": ev["calls"],
              "other": {k: v["usec"] for k, v in st.items() if v["usec"] > 20000}}))
finally:
    proc.kill()
