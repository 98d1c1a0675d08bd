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

``--proxy`` runs the same comparison through the real LiteLLM proxy server
(``litellm --config``, LiteLLM's ``proxy`` extra; ``make bench-litellm-proxy`` installs
it in ``.venv-litellm-proxy``, ``--proxy-python`` names another interpreter), started
anew for every arm of every run over the same fleet, requests sent with the OpenAI SDK
and TTFT measured from the call to the first content chunk of the proxy's stream:

- **contextpilot**: the callbacks module of ``docs/integrations/litellm.md`` with the
  strategy only (``litellm_settings.callbacks``);
- **simple-shuffle**, **least-busy**: ``router_settings.routing_strategy``;
- **contextpilot+hook**: the strategy and the ``ContextPilotHook``, the documents sent
  in the ``contextpilot`` field (``extra_body``) for the proxy's pilot to apply.

The first three send identical prompts, made by a pilot in the benchmark (as every
arm's hook does in the Router comparison), so only the routing differs; the fourth
shows the whole plug-in. Each proxy serves a short warm-up (other conversations, other
documents) before the engines are emptied and the run starts. Writes the
``litellm-proxy`` generated section.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost-map fetch
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "integrations" / "litellm") not in sys.path:  # until the package is installed
    sys.path.insert(0, str(ROOT / "integrations" / "litellm"))

from lib.sections import markdown_table, provenance, spread, write_or_print  # noqa: E402
from litellm.router import Router  # noqa: E402
from litellm_contextpilot import (  # noqa: E402
    ContextPilotHook,
    ContextPilotRoutingStrategy,
    read_pilot_request,
)
from litellm_contextpilot.testing import (  # noqa: E402
    LiteLLMProxy,
    find_proxy_python,
    installed_versions,
)

from contextpilot_rag import ContextPilot  # noqa: E402
from contextpilot_rag.batch.progress import rich_step_progress  # noqa: E402
from contextpilot_rag.sim.prefix_cache import PrefixCacheModel  # noqa: E402
from contextpilot_rag.sim.replay import EngineTokenizer  # noqa: E402
from contextpilot_rag.testing import SAMPLE_CORPUS, OpenAICompatibleServer  # noqa: E402
from contextpilot_rag.tokenizers import default_tokenizer  # noqa: E402

SECTION = "litellm-routing"
PROXY_SECTION = "litellm-proxy"
ARMS = ("contextpilot", "simple-shuffle", "least-busy")
HOOK_ARM = "contextpilot+hook"
PROXY_ARMS = (*ARMS, HOOK_ARM)
OURS = ("contextpilot", HOOK_ARM)
CALLBACKS = """\
from litellm_contextpilot import ContextPilotHook, ContextPilotRoutingStrategy

hook = ContextPilotHook()
strategy = ContextPilotRoutingStrategy("combined")
"""
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


def corpus(seed: int, prefix: str = "") -> list[dict[str, Any]]:
    rng = random.Random(seed)
    documents = []
    for topic in range(TOPICS):
        for n in range(DOCS_PER_TOPIC):
            words = " ".join(rng.choice(WORDS) for _ in range(170))
            text = f"Topic {topic}, document {n}. {words}."
            documents.append({"id": f"{prefix}t{topic}-d{n}", "text": text})
    return documents


def workload(scale: Scale, seed: int, prefix: str = "") -> list[Conversation]:
    """``prefix`` starts every conversation and document id (a warm-up's ids never
    meet a run's in a pilot that serves both)."""
    rng = random.Random(seed)
    documents = corpus(seed, prefix)
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
        start_s = rng.uniform(0, 1)
        conversations.append(Conversation(f"{prefix}conv-{c}", start_s, tuple(turns), think))
    return conversations


# -- one turn, one conversation ---------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One streamed answer as the client saw it."""

    ttft_s: float
    text: str
    prompt_tokens: int
    cached_tokens: int


Ask = Callable[[Conversation, Turn], Awaitable[Reply]]
"""Sends one turn of a conversation and returns its reply (one per arm and mode)."""


@dataclass
class ArmRun:
    ttfts: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, reply: Reply) -> None:
        self.ttfts.append(reply.ttft_s)
        self.prompt_tokens += reply.prompt_tokens
        self.cached_tokens += reply.cached_tokens


def pilot_field(conversation: Conversation, turn: Turn) -> dict[str, Any]:
    return {"documents": list(turn.documents), "conversation_id": conversation.conversation_id}


def question(turn: Turn) -> list[dict[str, Any]]:
    return [{"role": "user", "content": turn.question}]


async def read_stream(started: float, stream: AsyncIterator[Any]) -> Reply:
    """TTFT (from ``started`` to the first content chunk), text and cache usage of a
    stream of OpenAI chat chunks (LiteLLM's and the OpenAI SDK's have one shape)."""
    first: float | None = None
    parts: list[str] = []
    prompt_tokens = cached_tokens = 0
    async for chunk in stream:
        content = chunk.choices[0].delta.content if chunk.choices else None
        if content:
            first = first or time.perf_counter()
            parts.append(content)
        usage = getattr(chunk, "usage", None)
        if usage is not None and usage.prompt_tokens:
            prompt_tokens = usage.prompt_tokens
            details = usage.prompt_tokens_details
            cached_tokens = (details.cached_tokens or 0) if details else 0
    ttft = (first or time.perf_counter()) - started
    return Reply(ttft, "".join(parts), prompt_tokens, cached_tokens)


async def converse(ask: Ask, conversation: Conversation, run: ArmRun, advance: Advance) -> None:
    await asyncio.sleep(conversation.start_s)
    for turn, think_s in zip(conversation.turns, conversation.think_s, strict=True):
        run.add(await ask(conversation, turn))
        advance()
        await asyncio.sleep(think_s)


async def play(ask: Ask, conversations: Sequence[Conversation], advance: Advance) -> ArmRun:
    run = ArmRun()
    await asyncio.gather(*(converse(ask, c, run, advance) for c in conversations))
    return run


def reset(engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]]) -> None:
    for server, unit in engines:
        server.reset()
        unit.reset()


# -- the Router: one arm ----------------------------------------------------------


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


def router_ask(router: Router, hook: ContextPilotHook) -> Ask:
    """The hook rewrites the request in-process; its answer is recorded by the hook's
    LiteLLM callback."""

    async def ask(conversation: Conversation, turn: Turn) -> Reply:
        data: dict[str, Any] = {"model": MODEL, "messages": question(turn)}
        data["contextpilot"] = pilot_field(conversation, turn)
        hook.apply(data)  # in place: the pilot's messages, its metadata for the strategy
        started = time.perf_counter()
        stream = await router.acompletion(
            **data, stream=True, stream_options={"include_usage": True}, max_tokens=32
        )
        return await read_stream(started, stream)

    return ask


async def run_arm(
    arm: str,
    engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]],
    conversations: Sequence[Conversation],
    advance: Advance,
) -> ArmRun:
    reset(engines)
    router = router_for(arm, engines)
    hook = ContextPilotHook().attach()
    strategy = ContextPilotRoutingStrategy("combined") if arm == "contextpilot" else None
    try:
        if strategy is not None:
            strategy.attach(router)
        run = await play(router_ask(router, hook), conversations, advance)
        await asyncio.sleep(0.5)  # the last success callbacks
        return run
    finally:
        if strategy is not None:
            strategy.detach()
        hook.detach()


# -- the proxy: one arm -----------------------------------------------------------


def proxy_for(
    arm: str, engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]], python: str
) -> LiteLLMProxy:
    """The proxy of one arm: LiteLLM's strategies by name, ours through the callbacks
    module (the strategy attaches itself to the proxy's router)."""
    names = {"contextpilot": ("strategy",), HOOK_ARM: ("hook", "strategy")}.get(arm, ())
    return LiteLLMProxy(
        MODEL,
        [server.base_url for server, _ in engines],
        routing_strategy="simple-shuffle" if arm in OURS else arm,
        callbacks=[f"contextpilot_callbacks.{name}" for name in names],
        callbacks_source=CALLBACKS if names else None,
        python=python,
        pythonpath=[ROOT / "integrations" / "litellm"],
    )


async def stream_from(client: Any, messages: list[dict[str, Any]], **extra: Any) -> Reply:
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=32,
        **extra,
    )
    return await read_stream(started, stream)


def prompted_ask(client: Any, pilot: ContextPilot) -> Ask:
    """The benchmark's pilot makes the prompt (as the hook would) and records the
    answer; the proxy only routes it."""

    async def ask(conversation: Conversation, turn: Turn) -> Reply:
        request = read_pilot_request(pilot_field(conversation, turn), question(turn))
        prompt = pilot.optimize(
            list(request.documents), request.query, conversation_id=request.conversation_id
        )
        reply = await stream_from(client, [dict(m) for m in prompt.messages])
        pilot.record_answer(prompt, reply.text)
        if reply.prompt_tokens:
            pilot.observe_cache(prompt, reply.cached_tokens, reply.prompt_tokens)
        return reply

    return ask


def field_ask(client: Any) -> Ask:
    """The documents travel in the ``contextpilot`` field; the proxy's hook applies them."""

    async def ask(conversation: Conversation, turn: Turn) -> Reply:
        field = {"contextpilot": pilot_field(conversation, turn)}
        return await stream_from(client, question(turn), extra_body=field)

    return ask


async def drive_proxy(
    arm: str,
    proxy: LiteLLMProxy,
    engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]],
    warm_up: Sequence[Conversation],
    conversations: Sequence[Conversation],
    advance: Advance,
) -> ArmRun:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=proxy.base_url, api_key=proxy.api_key, max_retries=0) as client:

        def ask() -> Ask:  # a fresh pilot for the warm-up and for the run
            return field_ask(client) if arm == HOOK_ARM else prompted_ask(client, ContextPilot())

        await play(ask(), warm_up, advance)
        reset(engines)
        return await play(ask(), conversations, advance)


def run_proxy_arm(
    arm: str,
    engines: Sequence[tuple[OpenAICompatibleServer, PrefillUnit]],
    warm_up: Sequence[Conversation],
    conversations: Sequence[Conversation],
    python: str,
    advance: Advance,
) -> ArmRun:
    """One arm on a proxy of its own, stopped on the way out (Ctrl-C included)."""
    reset(engines)
    with proxy_for(arm, engines, python) as proxy:
        advance()
        return asyncio.run(drive_proxy(arm, proxy, engines, warm_up, conversations, advance))


# -- report --------------------------------------------------------------------------


@dataclass
class ArmResult:
    means: list[float] = field(default_factory=list)
    p95s: list[float] = field(default_factory=list)
    hit_ratios: list[float] = field(default_factory=list)
    requests: int = 0

    def add(self, run: ArmRun) -> None:
        self.means.append(statistics.fmean(run.ttfts))
        self.p95s.append(p95(run.ttfts))
        self.hit_ratios.append(run.cached_tokens / max(1, run.prompt_tokens))
        self.requests += len(run.ttfts)


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def warm_up_workload(seed: int) -> list[Conversation]:
    return workload(Scale(conversations=2, turns=2), seed - 1, prefix="warm-up-")


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
    warm_up = warm_up_workload(seed)
    for arm in ARMS:  # LiteLLM's first calls in a process pay for lazy imports and clients
        await run_arm(arm, engines, warm_up, lambda: None)
    for r in range(runs):
        conversations = workload(scale, seed + r)
        for arm in ARMS:
            advance = progress(f"run {r + 1}/{runs} {arm}", scale.conversations * scale.turns)
            results[arm].add(await run_arm(arm, engines, conversations, advance))
    return results


def measure_proxy(scale: Scale, runs: int, seed: int, python: str) -> dict[str, ArmResult]:
    """Every run, every arm in turn, each on a proxy started for it (the bar's first
    step is the proxy's start, then the warm-up, then the run)."""
    results = {arm: ArmResult() for arm in PROXY_ARMS}
    warm_up = warm_up_workload(seed)
    steps = 1 + sum(len(c.turns) for c in warm_up) + scale.conversations * scale.turns
    with fleet(scale) as engines, rich_step_progress() as progress:
        for r in range(runs):
            conversations = workload(scale, seed + r)
            for arm in PROXY_ARMS:
                advance = progress(f"run {r + 1}/{runs} {arm} (proxy)", steps)
                run = run_proxy_arm(arm, engines, warm_up, conversations, python, advance)
                results[arm].add(run)
    return results


def label(arm: str) -> str:
    if arm == "contextpilot":
        return "**contextpilot** (`combined`)"
    if arm == HOOK_ARM:
        return "**contextpilot** (`combined`) + `ContextPilotHook`"
    return f"`{arm}`"


def ratio_lines(results: dict[str, ArmResult], ours: str) -> list[str]:
    """Each LiteLLM strategy's mean and p95 TTFT over ``ours`` (median over runs)."""
    mine, lines = results[ours], []
    for arm, r in results.items():
        if arm in OURS:
            continue
        mean = statistics.median(a / b for a, b in zip(r.means, mine.means, strict=True))
        tail = statistics.median(a / b for a, b in zip(r.p95s, mine.p95s, strict=True))
        lines.append(f"- `{arm}` / {ours}: mean TTFT {mean:.2f}x, p95 TTFT {tail:.2f}x")
    return lines


def target_met(results: dict[str, ArmResult], ours: str) -> bool:
    mine = results[ours].means
    return all(
        statistics.median(a / b for a, b in zip(r.means, mine, strict=True)) >= TARGET
        for arm, r in results.items()
        if arm not in OURS
    )


def markdown(
    results: dict[str, ArmResult],
    scale: Scale,
    argv: Sequence[str],
    runs: int,
    proxy_litellm: str | None = None,
) -> str:
    """The section: the Router comparison, or with ``proxy_litellm`` (the proxy's
    LiteLLM version) the proxy's."""
    headers = ["routing", "mean TTFT", "p95 TTFT", "prompt tokens from cache", "requests"]
    rows = [
        [
            label(arm),
            spread([m * 1000 for m in r.means], ".0f", " ms"),
            spread([p * 1000 for p in r.p95s], ".0f", " ms"),
            spread([h * 100 for h in r.hit_ratios], ".1f", "%"),
            str(r.requests),
        ]
        for arm, r in results.items()
    ]
    ratios = ratio_lines(results, "contextpilot")
    if HOOK_ARM in results:
        ratios += ratio_lines(results, HOOK_ARM)
    met = "yes" if target_met(results, "contextpilot") else "no"
    judged = " (contextpilot, routing only)" if HOOK_ARM in results else ""
    engines = (
        f"{scale.replicas} loopback engines (prefix cache, one prefill unit each: "
        f"{scale.overhead_ms:.0f} ms + uncached tokens / {scale.prefill_rate:.0f} tokens/s, "
        f"then {scale.token_ms:.0f} ms per streamed word)"
    )
    workload_text = (
        f"{scale.conversations} concurrent conversations of {scale.turns} turns, "
        f"{K} documents per turn"
    )
    if proxy_litellm is None:
        title = "## LiteLLM Router: our strategy vs LiteLLM's (`benchmarks/litellm_routing.py`)"
        setup = (
            f"{engines} behind `litellm.Router` (litellm {litellm_version()}); "
            f"{workload_text}; every arm applies the same `ContextPilotHook`, only the "
            "routing strategy differs. TTFT at the client."
        )
    else:
        title = (
            "## LiteLLM proxy: our strategy vs LiteLLM's (`benchmarks/litellm_routing.py --proxy`)"
        )
        setup = (
            f"{engines} behind the LiteLLM proxy server (litellm {proxy_litellm}, one "
            f"worker, started anew for every arm of every run); {workload_text}, streamed "
            "through the OpenAI SDK. The first three arms send identical prompts, made "
            "by a pilot in the client: only the proxy's routing differs. The last sends "
            "the documents in the `contextpilot` field and the proxy's `ContextPilotHook` "
            "makes the prompt. TTFT at the client, through the proxy."
        )
    command = "python benchmarks/litellm_routing.py " + " ".join(argv)
    return "\n".join(
        [
            title,
            "",
            provenance(command, runs, "median over the runs (min–max where several)"),
            "",
            setup,
            "",
            *markdown_table(headers, rows),
            "",
            "TTFT of LiteLLM's strategies relative to ours (median over runs):",
            "",
            *ratios,
            "",
            f"Target (issue 21): mean TTFT at least {TARGET}x better than both{judged}: {met}.",
        ]
    )


def litellm_version(python: str | None = None) -> str:
    """LiteLLM's version here, or for the interpreter ``python``."""
    if python is None:
        from importlib.metadata import version

        return version("litellm")
    return installed_versions(python, ["litellm"]).get("litellm", "unknown")


def proxy_python(given: str | None) -> str | None:
    """The interpreter that runs the proxy: ``--proxy-python``, else
    ``LITELLM_PROXY_PYTHON``, else ``.venv-litellm-proxy`` (``make bench-litellm-proxy``),
    else this one; the first with LiteLLM's proxy and this plug-in."""
    if given is not None:
        return find_proxy_python([given])
    return find_proxy_python(
        [
            os.environ.get("LITELLM_PROXY_PYTHON"),
            ROOT / ".venv-litellm-proxy" / "bin" / "python",
            sys.executable,
        ]
    )


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the with-blocks: proxies and engines stop


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
    parser.add_argument("--proxy", action="store_true", help="through the real LiteLLM proxy")
    parser.add_argument("--proxy-python", help="the Python with litellm[proxy] (see --proxy)")
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
    if not args.proxy:
        text = markdown(measure(scale, runs, args.seed), scale, argv, runs)
        write_or_print(text + "\n", SECTION, args.write)
        return 0
    python = proxy_python(args.proxy_python)
    if python is None:
        parser.error(
            "no Python with LiteLLM's proxy and litellm-contextpilot: run "
            "`make bench-litellm-proxy`, or give --proxy-python"
        )
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    results = measure_proxy(scale, runs, args.seed, python)
    text = markdown(results, scale, argv, runs, proxy_litellm=litellm_version(python))
    write_or_print(text + "\n", PROXY_SECTION, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
