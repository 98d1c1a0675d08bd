"""Routing overhead of RoutingClient per request, network excluded (issue 6 target: 0.2 ms).

    python benchmarks/client_overhead.py

Times, per request, everything the client adds around the HTTP exchange: serialising
the messages, building the route keys, the policy decision with its route update, the
counters, and the feedback after the answer (``policy.observe``). Prompts: a system
prompt, 36 documents of ~2k characters drawn from 200 (~18k tokens) and a question;
two endpoints; 100 warm-up requests, then 500 timed.
"""

from __future__ import annotations

import platform
import random
import statistics
import time

from contextpilot_rag.routing import RoutingClient
from contextpilot_rag.routing.client import _Plan, _Reply

DOCS = [f"[doc{i}]\n" + f"Document {i} text about a topic. " * 60 for i in range(200)]


def prompts(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    system = {"role": "system", "content": "Answer from the documents. " * 20}
    return [
        [
            system,
            {"role": "user", "content": "\n\n".join(rng.sample(DOCS, 36))},
            {"role": "user", "content": f"Question {i}?"},
        ]
        for i in range(count)
    ]


def overhead_us(
    policy: str, workload: list[list[dict[str, str]]], warmup: int = 100
) -> list[float]:
    client = RoutingClient(
        [f"http://127.0.0.{k}:8000/v1" for k in (1, 2)], model="m", policy=policy
    )
    timings = []
    for i, messages in enumerate(workload):
        start = time.perf_counter_ns()
        plan = client._plan("chat", client._text("chat", messages), {}, f"l{i}", 0, frozenset())
        assert isinstance(plan, _Plan)  # nothing is queued here, so nothing is held
        reply = _Reply(first_token_at=time.monotonic(), done=True)
        reply.usage = {"prompt_tokens": 18_000, "prompt_tokens_details": {"cached_tokens": 0}}
        client._finish(plan, reply, None)
        if i >= warmup:
            timings.append((time.perf_counter_ns() - start) / 1_000)
    return timings


def main() -> None:
    workload = prompts(600)
    print(f"{platform.machine()}, CPython {platform.python_version()}")
    for policy in ("combined", "ranvier", "round-robin"):
        timings = sorted(overhead_us(policy, workload))
        p90 = timings[int(0.9 * (len(timings) - 1))]
        print(f"{policy:12s} median {statistics.median(timings):6.1f} us   p90 {p90:6.1f} us")


if __name__ == "__main__":
    main()
