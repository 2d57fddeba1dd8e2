"""`make bench`: speed and memory targets, measured and reported (never asserted in tests).

Each area owns a `bench_<area>() -> dict` in its own module; this runner times them, adds peak
memory, prints one table and writes `runs/bench.json`. `--long` adds the commands that take
minutes (the reproduction) to `commands`.
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
import time

from model import ROOT
from model.specs.specio import write_atomic

BENCHES = (
    ("kernels", "model.fit.calibrate", "bench_kernels"),
    ("perf", "model.bench.perf", "bench_perf"),
    ("search", "model.bench.search", "bench_search"),
    ("serving", "model.bench.serving", "bench_serving"),
    ("cache", "model.bench.cache", "bench_cache"),
    ("reproduce", "model.validate.reproduce", "bench_reproduce"),
    ("commands", "model.bench.commands", "bench_commands"),
)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(long: bool = False) -> dict:
    results = {}
    for area, module, func in BENCHES:
        start = time.perf_counter()
        bench = getattr(importlib.import_module(module), func)
        measured = bench(long=True) if long and area == "commands" else bench()
        results[area] = {**measured, "bench_wall_s": round(time.perf_counter() - start, 3),
                         "peak_rss_mib": round(_peak_rss_mib(), 1)}
    return results


def main(argv: list[str] | None = None) -> int:
    """Time every area's bench, print them and write runs/bench.json."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m model.bench", description=main.__doc__)
    ap.add_argument("--long", action="store_true", help="add the reproduction (minutes)")
    results = run(long=ap.parse_args(sys.argv[1:] if argv is None else argv).long)
    for area, measured in results.items():
        print(f"[{area}]")
        for key, value in measured.items():
            print(f"  {key}: {value}")
    path = write_atomic(ROOT / "runs" / "bench.json", json.dumps(results, indent=2, default=str))
    print(f"written: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
