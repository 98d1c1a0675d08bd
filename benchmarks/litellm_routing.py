"""LiteLLM Router with our routing strategy vs LiteLLM's own strategies, on loopback
engines with a prefix cache and a prefill clock.

    python benchmarks/litellm_routing.py --write docs/benchmarks.md

Fleet: ``--replicas`` OpenAI-compatible loopback engines
(:class:`~contextpilot_rag.testing.OpenAICompatibleServer`, reporting
``usage.prompt_tokens_details.cached_tokens``), each behind one *prefill unit*: a
prompt waits for the prompts before it (first come, first served), then takes
``--overhead-ms`` + its uncached tokens / ``--prefill-rate`` before its first token
(uncached by the engine's own prefix-cache model, vLLM's block-hash LRU); the answer
then streams one word per ``--token-ms``. Every arm drives ``litellm.Router`` over the
same fleet (``openai/<model>`` deployments, one per engine) with the same workload, and
the same :class:`litellm_contextpilot.ContextPilotHook` rewrites every request (the
pilot's documents in prefix-sharing order, repeats of the conversation as notes).
Only the routing differs:

- **contextpilot**: ``ContextPilotRoutingStrategy("combined")`` (expected TTFT from the
  learned prefix locations, queue and prefill rates, learned from LiteLLM's callbacks);
- **simple-shuffle**: LiteLLM's default (random);
- **least-busy**: LiteLLM's fewest requests in flight.

Workload (multi-turn RAG): ``--conversations`` conversations at once (started over the
first second, after a warm-up of every arm), ``--turns`` turns each with a think time of
0.2–0.6 s between turns; each turn retrieves ``k`` = 5 documents of ~200 tokens from
its topic (6 documents) and a neighbouring topic, in a new relevance order, so documents
recur within a conversation (de-duplicated) and across the conversations of a topic.
Engines, pilots and routers start empty for every arm. TTFT is measured at the client:
from the call to ``router.acompletion(stream=True)`` to the first content chunk. Writes the
``litellm-routing`` generated section; the target (issue 21): our mean TTFT at least
1.5x better than both LiteLLM strategies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost-map fetch
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "integrations" / "litellm") not in sys.path:  # until the package is installed
    sys.path.insert(0, str(ROOT / "integrations" / "litellm"))

from lib.sections import markdown_table, provenance, spread, write_or_print  # noqa: E402
from litellm.router import Router  # noqa: E402
from litellm_contextpilot import ContextPilotHook, ContextPilotRoutingStrategy  # noqa: E402

from contextpilot_rag.batch.progress import rich_step_progress  # noqa: E402
from contextpilot_rag.sim.prefix_cache import PrefixCacheModel  # noqa: E402
from contextpilot_rag.sim.replay import EngineTokenizer  # noqa: E402
from contextpilot_rag.testing import SAMPLE_CORPUS, OpenAICompatibleServer  # noqa: E402
from contextpilot_rag.tokenizers import default_tokenizer  # noqa: E402

SECTION = "litellm-routing"
ARMS = ("contextpilot", "simple-shuffle", "least-busy")
TARGET = 1.5
MODEL = "rag-model"
TOPICS = 8
DOCS_PER_TOPIC = 6
K = 5
WORDS = sorted({word for text in SAMPLE_CORPUS.values() for word in text.split()})
Advance = Callable[[], None]


@dataclass(frozen=True)
class Scale:
    replicas: int = 3
    conversations: int = 12
    turns: int = 4
    prefill_rate: float = 1500.0  # tokens/s of one engine's prefill unit
    overhead_ms: float = 20.0
    token_ms: float = 10.0


# -- the engines ---------------------------------------------------------------------


class PrefillUnit:
    """One engine's prefill: prompts one at a time in arrival order (tickets), each
    taking ``overhead_s`` + uncached tokens / ``rate``; the uncached tokens come from
    this unit's prefix-cache model, admitted in prefill order (the engine's own cache,
    which reports ``cached_tokens``, is admitted with the same prompts just after)."""

    def __init__(self, rate: float, overhead_s: float) -> None:
        self.rate, self.overhead_s = rate, overhead_s
        self.cache = PrefixCacheModel(block_size=16)
        self._tokens = EngineTokenizer(default_tokenizer())
        self._turn = threading.Condition()
        self._next_ticket = self._serving = 0

    def prefill(self, messages: Sequence[dict[str, Any]]) -> None:
        tokens = self._tokens([{"role": m["role"], "content": m["content"]} for m in messages])
        with self._turn:
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._turn.wait_for(lambda: self._serving == ticket)
        try:
            computed = self.cache.admit(tokens).computed_tokens
            time.sleep(self.overhead_s + computed / self.rate)
        finally:
            with self._turn:
                self._serving += 1
                self._turn.notify_all()

    def reset(self) -> None:
        self.cache.reset()


def timed_reply(unit: PrefillUnit) -> Callable[[list[dict[str, Any]]], str]:
    """The engine's reply function: prefill first (the server sends nothing before the
    reply is made), then a short answer."""

    def reply(messages: list[dict[str, Any]]) -> str:
        unit.prefill(messages)
        return "The documents answer this question in a few words."

    return reply


@contextlib.contextmanager
def fleet(scale: Scale) -> Iterator[list[tuple[OpenAICompatibleServer, PrefillUnit]]]:
    with contextlib.ExitStack() as stack:
        engines = []
        for _ in range(scale.replicas):
            unit = PrefillUnit(scale.prefill_rate, scale.overhead_ms / 1000)
            server = OpenAICompatibleServer(
                model=MODEL, reply=timed_reply(unit), token_delay_s=scale.token_ms / 1000
            )
            engines.append((stack.enter_context(server), unit))
        yield engines


# -- the workload --------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    documents: tuple[dict[str, Any], ...]
    question: str


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    start_s: float
    turns: tuple[Turn, ...]
    think_s: tuple[float, ...]


def corpus(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    documents = []
    for topic in range(TOPICS):
        for n in range(DOCS_PER_TOPIC):
            words = " ".join(rng.choice(WORDS) for _ in range(170))
            text = f"Topic {topic}, document {n}. {words}."
            documents.append({"id": f"t{topic}-d{n}", "text": text})
    return documents


def workload(scale: Scale, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    documents = corpus(seed)
    conversations = []
    for c in range(scale.conversations):
        topic = c % TOPICS
        own = documents[topic * DOCS_PER_TOPIC : (topic + 1) * DOCS_PER_TOPIC]
        neighbour = documents[((topic + 1) % TOPICS) * DOCS_PER_TOPIC :][:DOCS_PER_TOPIC]
        turns = []
        for t in range(scale.turns):
            picked = rng.sample(own, K - 1) + rng.sample(neighbour, 1)
            rng.shuffle(picked)
            scored = tuple({**d, "score": round(1 - i / K, 2)} for i, d in enumerate(picked))
            turns.append(Turn(scored, f"Conversation {c}, question {t}: what do they say?"))
        think = tuple(rng.uniform(0.2, 0.6) for _ in range(scale.turns))
        conversations.append(Conversation(f"conv-{c}", rng.uniform(0, 1), tuple(turns), think))
    return conversations


# -- one arm -------------------------------------------------------------------------


@dataclass
class ArmRun:
    ttfts: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0


def router_for(arm: str, engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]]) -> Router:
    model_list = [
        {
            "model_name": MODEL,
            "litellm_params": {
                "model": f"openai/{MODEL}",
                "api_base": server.base_url,
                "api_key": "loopback",
            },
        }
        for server, _ in engines
    ]
    strategy = "simple-shuffle" if arm == "contextpilot" else arm  # ours replaces it
    router: Router = Router(model_list=model_list, routing_strategy=strategy, num_retries=0)
    return router


async def converse(
    router: Router,
    hook: ContextPilotHook,
    conversation: Conversation,
    run: ArmRun,
    advance: Advance,
) -> None:
    await asyncio.sleep(conversation.start_s)
    for turn, think_s in zip(conversation.turns, conversation.think_s, strict=True):
        data: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": turn.question}],
            "contextpilot": {
                "documents": list(turn.documents),
                "conversation_id": conversation.conversation_id,
            },
        }
        hook.apply(data)
        started = time.perf_counter()
        stream = await router.acompletion(
            **data, stream=True, stream_options={"include_usage": True}, max_tokens=32
        )
        first: float | None = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
            usage = getattr(chunk, "usage", None)
            if usage is not None and usage.prompt_tokens:
                run.prompt_tokens += usage.prompt_tokens
                details = usage.prompt_tokens_details
                run.cached_tokens += (details.cached_tokens or 0) if details else 0
        run.ttfts.append((first or time.perf_counter()) - started)
        advance()
        await asyncio.sleep(think_s)


async def run_arm(
    arm: str,
    engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]],
    conversations: Sequence[Conversation],
    advance: Advance,
) -> ArmRun:
    for server, unit in engines:
        server.reset()
        unit.reset()
    router = router_for(arm, engines)
    hook = ContextPilotHook().attach()
    strategy = ContextPilotRoutingStrategy("combined") if arm == "contextpilot" else None
    try:
        if strategy is not None:
            strategy.attach(router)
        run = ArmRun()
        await asyncio.gather(*(converse(router, hook, c, run, advance) for c in conversations))
        await asyncio.sleep(0.5)  # the last success callbacks
        return run
    finally:
        if strategy is not None:
            strategy.detach()
        hook.detach()


# -- report --------------------------------------------------------------------------


@dataclass
class ArmResult:
    means: list[float] = field(default_factory=list)
    p95s: list[float] = field(default_factory=list)
    hit_ratios: list[float] = field(default_factory=list)
    requests: int = 0


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def measure(scale: Scale, runs: int, seed: int) -> dict[str, ArmResult]:
    """Every run, every arm in turn, in one event loop (LiteLLM keeps its HTTP clients
    for the loop they were made in)."""
    with fleet(scale) as engines, rich_step_progress() as progress:
        return asyncio.run(measure_arms(scale, runs, seed, engines, progress))


async def measure_arms(
    scale: Scale,
    runs: int,
    seed: int,
    engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]],
    progress: Callable[[str, int], Advance],
) -> dict[str, ArmResult]:
    results = {arm: ArmResult() for arm in ARMS}
    warm_up = workload(Scale(conversations=2, turns=2), seed - 1)
    for arm in ARMS:  # LiteLLM's first calls in a process pay for lazy imports and clients
        await run_arm(arm, engines, warm_up, lambda: None)
    for r in range(runs):
        conversations = workload(scale, seed + r)
        for arm in ARMS:
            advance = progress(f"run {r + 1}/{runs} {arm}", scale.conversations * scale.turns)
            run = await run_arm(arm, engines, conversations, advance)
            result = results[arm]
            result.means.append(statistics.fmean(run.ttfts))
            result.p95s.append(p95(run.ttfts))
            result.hit_ratios.append(run.cached_tokens / max(1, run.prompt_tokens))
            result.requests += len(run.ttfts)
    return results


def markdown(results: dict[str, ArmResult], scale: Scale, argv: Sequence[str], runs: int) -> str:
    ours = results["contextpilot"]
    headers = ["routing", "mean TTFT", "p95 TTFT", "prompt tokens from cache", "requests"]
    rows = [
        [
            f"`{arm}`" if arm != "contextpilot" else "**contextpilot** (`combined`)",
            spread([m * 1000 for m in r.means], ".0f", " ms"),
            spread([p * 1000 for p in r.p95s], ".0f", " ms"),
            spread([h * 100 for h in r.hit_ratios], ".1f", "%"),
            str(r.requests),
        ]
        for arm, r in results.items()
    ]
    ratios = {
        arm: (
            statistics.median(a / b for a, b in zip(r.means, ours.means, strict=True)),
            statistics.median(a / b for a, b in zip(r.p95s, ours.p95s, strict=True)),
        )
        for arm, r in results.items()
        if arm != "contextpilot"
    }
    met = "yes" if all(mean >= TARGET for mean, _ in ratios.values()) else "no"
    ratio_lines = [
        f"- `{arm}` / contextpilot: mean TTFT {mean:.2f}x, p95 TTFT {tail:.2f}x"
        for arm, (mean, tail) in ratios.items()
    ]
    return "\n".join(
        [
            "## LiteLLM Router: our strategy vs LiteLLM's (`benchmarks/litellm_routing.py`)",
            "",
            provenance(
                "python benchmarks/litellm_routing.py " + " ".join(argv),
                runs,
                "median over the runs (min–max where several)",
            ),
            "",
            f"{scale.replicas} loopback engines (prefix cache, one prefill unit each: "
            f"{scale.overhead_ms:.0f} ms + uncached tokens / {scale.prefill_rate:.0f} tokens/s, "
            f"then {scale.token_ms:.0f} ms per streamed word) behind `litellm.Router` "
            f"(litellm {litellm_version()}); {scale.conversations} concurrent conversations "
            f"of {scale.turns} turns, {K} documents per turn; every arm applies the same "
            "`ContextPilotHook`, only the routing strategy differs. TTFT at the client.",
            "",
            *markdown_table(headers, rows),
            "",
            "TTFT of LiteLLM's strategies relative to ours (median over runs):",
            "",
            *ratio_lines,
            "",
            f"Target (issue 21): mean TTFT at least {TARGET}x better than both: {met}.",
        ]
    )


def litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=Scale.replicas)
    parser.add_argument("--conversations", type=int, default=Scale.conversations)
    parser.add_argument("--turns", type=int, default=Scale.turns)
    parser.add_argument("--prefill-rate", type=float, default=Scale.prefill_rate)
    parser.add_argument("--overhead-ms", type=float, default=Scale.overhead_ms)
    parser.add_argument("--token-ms", type=float, default=Scale.token_ms)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    scale = Scale(
        max(1, args.replicas),
        max(1, args.conversations),
        max(1, args.turns),
        args.prefill_rate,
        args.overhead_ms,
        args.token_ms,
    )
    runs = max(1, args.runs)
    text = markdown(measure(scale, runs, args.seed), scale, argv, runs) + "\n"
    write_or_print(text, SECTION, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
