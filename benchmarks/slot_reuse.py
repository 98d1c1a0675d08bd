"""How much of the llama-server stream's prompts one-prompt slots could serve from cache.

    python benchmarks/slot_reuse.py --write docs/benchmarks.md   # llama_server_routing.py's stream

Offline, no engine: the prompts of ``llama_server_routing.py --workload stream`` (the
topic workload, every prompt built by one ``ContextPilot.optimize`` in arrival order),
rendered as the completion text the client sends. Shares are of prompt characters
that a cache could serve as a shared prefix:

- ``unbounded``: the longest prefix shared with any earlier prompt (a prefix cache that
  keeps everything);
- ``greedy N slots``: N slots holding one prompt each, every prompt sent to the slot
  whose prompt shares the longest prefix with it (ties: least recently used), which
  then holds it;
- ``round-robin N slots``: the same slots taken in turn;
- ``reordered for the slot, N slots``: route first, then build the prompt for the
  slot: each request goes to the slot whose prompt starts with the most of its
  documents (ties: least recently used) and its documents follow that prompt's order,
  the rest by popularity so far (as ``ContextPilot`` orders a remainder), rendered by
  ``ContextPilot.optimize`` with reordering off; its share is of these prompts;
- ``N replicas keeping every prefix``: engines whose prefix cache keeps every earlier
  prompt (vLLM's, unbounded here), each prompt sent round-robin or to the replica
  holding its longest prefix (ties: the replica with fewer prompts).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from lib.sections import markdown_table, provenance, write_section
from llama_server_routing import stream_prompts, stream_workload  # this directory

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
from contextpilot_rag.bench.workloads import Workload
from contextpilot_rag.routing.prompt_keys import serialise


def shared(a: str, b: str) -> int:
    """Characters of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def unbounded(texts: Sequence[str]) -> int:
    return sum(max((shared(t, u) for u in texts[:i]), default=0) for i, t in enumerate(texts))


def greedy_slots(texts: Sequence[str], slots: int) -> int:
    held, used, total = [""] * slots, [-1] * slots, 0
    for i, text in enumerate(texts):
        best = max(range(slots), key=lambda s: (shared(held[s], text), -used[s]))
        total += shared(held[best], text)
        held[best], used[best] = text, i
    return total


def round_robin_slots(texts: Sequence[str], slots: int) -> int:
    held, total = [""] * slots, 0
    for i, text in enumerate(texts):
        total += shared(held[i % slots], text)
        held[i % slots] = text
    return total


def leading(order: Sequence[str], wanted: set[str]) -> int:
    """How many documents of ``wanted`` ``order`` starts with."""
    count = 0
    while count < len(order) and order[count] in wanted:
        count += 1
    return count


def reordered_slots(workload: Workload, slots: int) -> tuple[int, int]:
    """(shared prefix characters, prompt characters) when every prompt is built for
    the slot it is sent to (module docstring)."""
    pilot = ContextPilot(PilotConfig(reorder=False))
    held: list[list[str]] = [[] for _ in range(slots)]
    texts, used = [""] * slots, [-1] * slots
    popularity: Counter[str] = Counter()
    total = size = 0
    for i, request in enumerate(workload.requests):
        wanted = set(request.doc_ids)
        best = max(range(slots), key=lambda s: (leading(held[s], wanted), -used[s]))
        order = held[best][: leading(held[best], wanted)]
        order += sorted(wanted - set(order), key=lambda d: (-popularity[d], d))
        blocks = [ContextBlock(text=workload.corpus[d], id=d) for d in order]
        prompt = pilot.optimize(blocks, request.query, system=workload.system_prompt)
        text = serialise(prompt, completion=True).text
        total, size = total + shared(texts[best], text), size + len(text)
        held[best], texts[best], used[best] = order, text, i
        popularity.update(wanted)
    return total, size


def replicas_keeping_everything(texts: Sequence[str], replicas: int) -> tuple[int, int]:
    """(round-robin, longest-prefix routing) shared characters over ``replicas``
    prefix caches that keep every prompt they were sent."""

    def best(held: list[str], text: str) -> int:
        return max((shared(earlier, text) for earlier in held), default=0)

    turns: list[list[str]] = [[] for _ in range(replicas)]
    routed: list[list[str]] = [[] for _ in range(replicas)]
    by_turn = by_prefix = 0
    for i, text in enumerate(texts):
        by_turn += best(turns[i % replicas], text)
        turns[i % replicas].append(text)
        scores = [(best(held, text), -len(held)) for held in routed]
        chosen = max(range(replicas), key=scores.__getitem__)
        by_prefix += scores[chosen][0]
        routed[chosen].append(text)
    return by_turn, by_prefix


def shares(args: argparse.Namespace) -> list[list[str]]:
    """One row per cache layout: its name and the share of prompt characters reusable."""
    workload = stream_workload(args)
    texts = [serialise(p, completion=True).text for p in stream_prompts(workload)]
    size = sum(len(t) for t in texts)
    rows = [["unbounded prefix cache", f"{unbounded(texts) / size:.1%}"]]
    for slots in (2, 4, 8):
        reused, total = reordered_slots(workload, slots)
        rows += [
            [f"greedy, {slots} slots", f"{greedy_slots(texts, slots) / size:.1%}"],
            [f"round-robin, {slots} slots", f"{round_robin_slots(texts, slots) / size:.1%}"],
            [f"reordered for the slot, {slots} slots", f"{reused / total:.1%}"],
        ]
    for replicas in (2, 4):
        by_turn, by_prefix = replicas_keeping_everything(texts, replicas)
        rows += [
            [f"{replicas} replicas keeping every prefix, round-robin", f"{by_turn / size:.1%}"],
            [
                f"{replicas} replicas keeping every prefix, longest-prefix routing",
                f"{by_prefix / size:.1%}",
            ],
        ]
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--topics", type=int, default=8)
    parser.add_argument("--docs-per-topic", type=int, default=8)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    out = [
        "## Prefix reuse one-prompt slots could serve, llama-server stream prompts "
        "(`benchmarks/slot_reuse.py`)",
        "",
        provenance(
            "python benchmarks/slot_reuse.py " + " ".join(argv),
            1,
            "none: offline and deterministic (seeded workload, no engine)",
        ),
        f"- workload: the `--workload stream` prompts of `llama_server_routing.py` "
        f"({args.requests} requests, {args.topics} topics of {args.docs_per_topic} "
        f"documents, {args.k} per request, seed {args.seed}); share = prompt characters "
        "a cache could serve as a shared prefix",
        "",
        *markdown_table(["cache layout", "reusable share"], shares(args)),
    ]
    text = "\n".join(out) + "\n"
    if args.write:
        write_section(args.write, "slot-reuse", text)
        print(f"wrote {args.write}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
