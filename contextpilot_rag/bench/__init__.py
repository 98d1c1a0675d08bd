"""Benchmarks: seeded synthetic workloads and the measurements run over them.

Workloads are deterministic functions of their arguments, so a benchmark's numbers
are reproducible from its command line alone.
"""

from .workloads import (
    SYSTEM_PROMPT,
    ZIPF_EXPONENT,
    Workload,
    WorkloadRequest,
    multiturn_workload,
    online_workload,
    top_share,
    topic_workload,
)

__all__ = [
    "SYSTEM_PROMPT",
    "ZIPF_EXPONENT",
    "Workload",
    "WorkloadRequest",
    "multiturn_workload",
    "online_workload",
    "top_share",
    "topic_workload",
]
