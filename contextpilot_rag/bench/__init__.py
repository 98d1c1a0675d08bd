"""Seeded synthetic RAG workloads: the traffic the demo and the benchmarks replay.

Workloads are deterministic functions of their arguments, so a benchmark's numbers
are reproducible from its command line alone. The benchmarks themselves are scripts
of the source checkout (``benchmarks/``), not part of the installed package.
"""

from .workloads import (
    DOC_WORDS,
    SYSTEM_PROMPT,
    ZIPF_EXPONENT,
    TextLengths,
    Workload,
    WorkloadRequest,
    intent_workload,
    multiturn_workload,
    online_workload,
    top_share,
    topic_workload,
)

__all__ = [
    "DOC_WORDS",
    "SYSTEM_PROMPT",
    "ZIPF_EXPONENT",
    "TextLengths",
    "Workload",
    "WorkloadRequest",
    "intent_workload",
    "multiturn_workload",
    "online_workload",
    "top_share",
    "topic_workload",
]
