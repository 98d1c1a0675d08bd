"""One side of ``benchmarks/compare_commits.py``: run with the checkout under test first
on ``PYTHONPATH``; prints one JSON object of timings. Uses only the public API that both
sides of a comparison have: ``ContextPilot.optimize`` on ``online_workload`` and
``measure_decision_cost`` of every registered policy."""

from __future__ import annotations

import json
import statistics
import sys
import time

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.bench.workloads import online_workload
from contextpilot_rag.routing import POLICY_NAMES, make_policy
from contextpilot_rag.routing.measure import measure_decision_cost


def optimize_p50_us(requests: int) -> float:
    workload = online_workload(n_requests=requests)
    blocks = {doc_id: ContextBlock(text, id=doc_id) for doc_id, text in workload.corpus.items()}
    pilot = ContextPilot()
    timings = []
    for request in workload.requests:
        chosen = [blocks[doc_id] for doc_id in request.doc_ids]
        started = time.perf_counter()
        pilot.optimize(chosen, request.query, system=workload.system_prompt)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1e6


def main() -> None:
    requests = int(sys.argv[1])
    result = {"optimize": optimize_p50_us(requests)}
    for name in POLICY_NAMES:
        result[f"decision:{name}"] = measure_decision_cost(make_policy(name))["p50_us"]
    print(json.dumps({"module": ContextPilot.__module__, "timings_us": result}))


if __name__ == "__main__":
    main()
