"""Peak memory of ``plan_batch`` in a fresh process; run by :func:`batch.measure_plan_memory`.

    python -I benchmarks/lib/plan_memory.py '[n_requests, n_docs, k, seed, method, schedule]'

Prints one JSON object: ``seconds`` (one planning run), ``peak_rss_mb`` (peak resident
memory of this whole process: interpreter, workload and plan) and ``plan_mb`` (peak
memory allocated while planning, from tracemalloc, which also sees numpy's buffers).
"""

from __future__ import annotations

import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

from contextpilot_rag.batch import plan_batch
from contextpilot_rag.bench.workloads import online_workload


def peak_rss_kib() -> int:
    """This process's peak resident memory. ``VmHWM`` belongs to the address space
    created by ``exec``; ``ru_maxrss`` would also count the forking parent's memory."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def main(arguments: str) -> None:
    n_requests, n_docs, k, seed, method, schedule = json.loads(arguments)
    workload = online_workload(n_docs=n_docs, n_requests=n_requests, k=k, seed=seed)
    codes: dict[str, int] = {}
    coded = [[codes.setdefault(d, len(codes)) for d in r.doc_ids] for r in workload.requests]
    del workload
    started = time.perf_counter()
    plan_batch(coded, method=method, schedule=schedule)
    seconds = time.perf_counter() - started
    peak_rss_mb = peak_rss_kib() / 1024
    tracemalloc.start()
    plan_batch(coded, method=method, schedule=schedule)
    _, traced_peak = tracemalloc.get_traced_memory()
    result = {"seconds": seconds, "peak_rss_mb": peak_rss_mb, "plan_mb": traced_peak / 2**20}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
