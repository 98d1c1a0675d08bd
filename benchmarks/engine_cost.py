"""What a cached prefix saves on the engine: time to first token of N new tokens after
P cached ones, against computing all P + N from scratch.

    python benchmarks/engine_cost.py --write docs/benchmarks.md
    python benchmarks/engine_cost.py --endpoint URL --model NAME   # any running vLLM

Starts the project's engine (vLLM CPU build + SmolLM2 by default) like the real-engine
suite, then for each (P, N): resets the prefix cache, sends P random token ids (to
cache them), sends the same P followed by N new ones and reads its TTFT and cached
tokens; and, on a reset cache, sends P + N ids at once. Random ids, one request at a
time, streamed, one generated token. The ratio of the two times is what the prefix
cache buys for a prompt of that shape; it explains why TTFT falls less than computed
tokens when prompts grow long (each new token still attends over the whole prefix).
Writes the ``engine-cost`` section.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from lib.sections import provenance, write_section
from rich.console import Console
from rich.table import Table

from contextpilot_rag.batch.progress import rich_step_progress
from contextpilot_rag.bench.commands import add_engine_arguments, engine_session

SECTION = "engine-cost"
CACHED = (1024, 2048, 4096)
NEW = (256, 1024)


def _ttft(http: httpx.Client, url: str, model: str, ids: list[int]) -> tuple[float, int]:
    """Seconds to the first streamed token, and the cached tokens the engine reported."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    cached = 0
    with http.stream("POST", f"{url}/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - started
            usage = chunk.get("usage") or {}
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if first is None:
        raise RuntimeError("the engine streamed no token")
    return first, cached


def measure(
    engine: object, cached_sizes: Sequence[int], new_sizes: Sequence[int], seed: int, tick: object
) -> list[dict[str, float]]:
    url, model = engine.base_url, engine.model_name  # type: ignore[attr-defined]
    rng = random.Random(seed)
    rows = []
    with httpx.Client(timeout=600.0) as http:
        _ttft(http, url, model, [rng.randrange(1000, 40_000) for _ in range(32)])  # warm up
        for prefix in cached_sizes:
            for new in new_sizes:
                head = [rng.randrange(1000, 40_000) for _ in range(prefix)]
                tail = [rng.randrange(1000, 40_000) for _ in range(new)]
                engine.reset_prefix_cache()  # type: ignore[attr-defined]
                _ttft(http, url, model, head)
                warm, cached = _ttft(http, url, model, head + tail)
                engine.reset_prefix_cache()  # type: ignore[attr-defined]
                cold, _ = _ttft(http, url, model, head + tail)
                rows.append(
                    {"cached": prefix, "new": new, "reported_cached": cached, "warm_s": warm}
                    | {"cold_s": cold}
                )
                tick()  # type: ignore[operator]
    return rows


def markdown(rows: list[dict[str, float]], facts: str) -> str:
    lines = [
        f"{facts}. Random token ids; each pair on a reset prefix cache.",
        "",
        "| cached P | new N | engine-reported cached | TTFT, P cached s | TTFT, P + N cold s "
        "| speed-up | cold / (N / (P + N)) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = r["new"] / (r["cached"] + r["new"])
        lines.append(
            f"| {r['cached']:,} | {r['new']:,} | {r['reported_cached']:,} | {r['warm_s']:.2f} "
            f"| {r['cold_s']:.2f} | {r['cold_s'] / r['warm_s']:.2f}x "
            f"| {1 / share:.2f}x |"
        )
    lines += [
        "",
        "*speed-up* is what the cached prefix bought; the last column is what it would buy "
        "if time were proportional to computed tokens.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, help="docs file to write the section into")
    args = parser.parse_args(argv)
    console = Console()
    with engine_session(args, console) as engine, rich_step_progress() as progress:
        tick = progress("prefix cost", len(CACHED) * len(NEW))
        rows = measure(engine, CACHED, NEW, args.seed, tick)
        flags = getattr(engine, "flags", None)
        facts = f"Engine `{getattr(engine, 'kind', 'external')}` serving `{engine.model_name}`"
        facts += f" (flags `{' '.join(flags)}`)" if flags else ""
    table = Table(title="TTFT with a cached prefix vs cold")
    for column in ("P", "N", "cached", "warm s", "cold s", "speed-up"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            f"{r['cached']:,}",
            f"{r['new']:,}",
            f"{r['reported_cached']:,}",
            f"{r['warm_s']:.2f}",
            f"{r['cold_s']:.2f}",
            f"{r['cold_s'] / r['warm_s']:.2f}x",
        )
    console.print(table)
    if args.write:
        command = "python benchmarks/engine_cost.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        body = provenance(command.strip(), 1, "one run; each ratio within one pair")
        write_section(args.write, SECTION, body + "\n\n" + markdown(rows, facts))
        console.print(f"wrote section {SECTION} of {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
