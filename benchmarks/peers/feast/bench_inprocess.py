"""Feast's online reads in process, and the raw redis-py floor on the same keys.

    python bench_inprocess.py REPO [CALLS] [OUT_JSON]

Runs in the Feast peer's environment against a repository whose Redis is up (``store.py``).
Each case: 200 warm-up calls, then CALLS timed calls (``perf_counter_ns`` around one call), on
random cards drawn beforehand with one seed for every case. Prints a JSON line per case and
writes ``{"meta": ..., "results": [...]}`` to OUT_JSON.
"""

import asyncio
import json
import os
import sys
import time

import numpy as np
import redis
from feast import FeatureStore
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import _mmh3
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value

REPO = sys.argv[1]
CALLS = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
OUT = sys.argv[3] if len(sys.argv) > 3 else None
WARM = 200
N_VIEWS, N_FEATS = 5, 8

store = FeatureStore(repo_path=REPO)
REFS = [f"fv{v}:fv{v}_f{j}" for v in range(N_VIEWS) for j in range(N_FEATS)]
SERVICE = store.get_feature_service("all_features")
host, port = store.config.online_store.connection_string.split(",")[0].split(":")
client = redis.Redis(host=host, port=int(port))
cards = client.dbsize()
rng = np.random.default_rng(42)
ids1 = rng.integers(0, cards, WARM + CALLS).tolist()
ids10 = rng.integers(0, cards, (WARM + CALLS, 10)).tolist()
results = []


def report(name, ns):
    us = np.asarray(ns, dtype=np.float64) / 1000.0
    row = {"case": name, "calls": len(us),
           **{f"p{p}_us": round(float(np.percentile(us, p)), 1) for p in (50, 90, 99)},
           "mean_us": round(float(us.mean()), 1), "max_us": round(float(us.max()), 1)}
    results.append(row)
    print(json.dumps(row), flush=True)


def run(name, fn, args):
    for a in args[:WARM]:
        fn(a)
    ns = []
    for a in args[WARM:]:
        t = time.perf_counter_ns()
        fn(a)
        ns.append(time.perf_counter_ns() - t)
    report(name, ns)


async def run_async(name, rows):
    for r in rows[:WARM]:
        await store.get_online_features_async(features=REFS, entity_rows=r)
    ns = []
    for r in rows[WARM:]:
        t = time.perf_counter_ns()
        await store.get_online_features_async(features=REFS, entity_rows=r)
        ns.append(time.perf_counter_ns() - t)
    report(name, ns)


# every value of a card is there, as a float
one = store.get_online_features(features=REFS, entity_rows=[{"card": 7}]).to_dict()
assert all(one[r.split(":")[1]][0] is not None for r in REFS), one

rows1 = [[{"card": k}] for k in ids1]
rows10 = [[{"card": k} for k in ks] for ks in ids10]
run("feast get_online_features, 40 refs, 1 row",
    lambda r: store.get_online_features(features=REFS, entity_rows=r), rows1)
run("feast get_online_features, 40 refs, 1 row, + .to_dict()",
    lambda r: store.get_online_features(features=REFS, entity_rows=r).to_dict(), rows1)
run("feast get_online_features, feature service, 1 row",
    lambda r: store.get_online_features(features=SERVICE, entity_rows=r), rows1)
run("feast get_online_features, 40 refs, 10 rows",
    lambda r: store.get_online_features(features=REFS, entity_rows=r), rows10)
asyncio.run(run_async("feast get_online_features_async, 40 refs, 1 row", rows1))

# The floor: redis-py on the keys Feast wrote, the commands Feast sends.
version = store.config.entity_key_serialization_version
project = store.config.project.encode()


def key(card):
    entity = EntityKey(join_keys=["card"], entity_values=[Value(int64_val=card)])
    return serialize_entity_key(entity, entity_key_serialization_version=version) + project


FIELDS = [[_mmh3(f"fv{v}:fv{v}_f{j}") for j in range(N_FEATS)] + [f"_ts:fv{v}"]
          for v in range(N_VIEWS)]
keys1 = [key(k) for k in ids1]
keys10 = [[key(k) for k in ks] for ks in ids10]
assert client.hlen(keys1[0]) == N_VIEWS * (N_FEATS + 1)


def hmgets(keys):
    with client.pipeline(transaction=False) as pipe:
        for k in keys:
            for fields in FIELDS:
                pipe.hmget(k, fields)
        return pipe.execute()


run("redis-py PING (round-trip floor)", lambda k: client.ping(), keys1)
run("redis-py pipeline 5x HMGET (9 fields each; what Feast sends), 1 row",
    lambda k: hmgets([k]), keys1)
run("redis-py pipeline 50x HMGET (what Feast sends), 10 rows", hmgets, keys10)

meta = {"repo": REPO, "warmup": WARM, "calls": CALLS, "cards": cards,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "redis_server": client.info("server")["redis_version"]}
if OUT:
    with open(OUT, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
print(json.dumps(meta))
