"""Summarise ``gc_probe`` files: per process and generation, how many collections and how long.

    .venv/bin/python benchmarks/pipeline/gc_summary.py /tmp/gc      # reads /tmp/gc.<pid>
"""

from __future__ import annotations

import argparse
import glob
import json


def summary(path: str) -> dict:
    doc = json.load(open(path))
    out: dict = {"process": doc["cmd"][-80:]}
    for gen, rows in sorted(doc["collections"].items()):
        cpu = sorted(r[1] / 1e3 for r in rows)
        out[f"gen{gen}"] = {"n": len(cpu), "cpu_us_p50": round(cpu[len(cpu) // 2]),
                            "cpu_us_p90": round(cpu[9 * len(cpu) // 10]),
                            "cpu_us_max": round(cpu[-1]), "collected": sum(r[2] for r in rows)}
    if doc["young"]:
        out["last_young_census"] = doc["young"][-1]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", help="GCPROBE_OUT of the run")
    args = parser.parse_args()
    for path in sorted(glob.glob(args.prefix + ".*")):
        print(json.dumps(summary(path)))


if __name__ == "__main__":
    main()
