"""The real-engine benchmark: every arm of a workload sent to a running engine, one
request at a time, with the engine's own account of its cache.

For each arm the engine's prefix cache is reset (vLLM's ``/reset_prefix_cache``), then
each request is streamed (``stream_options.include_usage``) and timed: time to first
token (TTFT) from sending to the first generated token, the request's wall time, and
the engine-reported ``prompt_tokens`` / ``prompt_tokens_details.cached_tokens`` (or
llama-server's ``timings``). Alongside, the prompt's token ids as the engine tokenizes
them (vLLM ``/tokenize`` with the chat template applied) are replayed through a model
of the engine's cache (:func:`prediction_cache`: vLLM's prefix cache at its block size
and capacity, llama-server's slot and prompt cache), so each arm also has the
*simulated* computed tokens for the very same prompt sequence: the sim-to-real check.

Invariants: arms of one workload run back to back on the same engine with a cold
cache each; nothing but the suite talks to the engine meanwhile (the numbers assume
it); a report without cache information fails the run (never read as 0 cached).
"""

from __future__ import annotations

import json
import math
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx

from ..errors import ConfigError, InvalidInputError
from ..sim.prefix_cache import PrefixCacheModel, salted_tokens
from ..sim.slot_cache import LlamaServerCacheModel
from ..usage import CacheUsage, parse_cache_usage
from .engine_workloads import Arm, EngineWorkload, FixedArm, Messages

__all__ = [
    "ArmRun",
    "EngineTarget",
    "FamilyRun",
    "Sent",
    "WorkloadRun",
    "check_repeats",
    "engine_tokenizer",
    "median_pass",
    "prediction_cache",
    "run_workload",
    "send_chat",
    "simulate_family",
]

Tokenize = Callable[[Messages], list[int]]
"""A prompt's token ids as the engine sees them (chat template applied)."""
TokenizeText = Callable[[str], list[int]]
Tick = Callable[[], None]
CacheModel = PrefixCacheModel | LlamaServerCacheModel
"""A model of an engine's cache that predicts each request's cached tokens."""


class EngineTarget(Protocol):
    """What the suite needs of a running engine (``contextpilot_rag.engines``'
    running engines have it)."""

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible ``/v1`` root."""
        ...

    @property
    def model_name(self) -> str: ...

    @property
    def block_size(self) -> int | None:
        """Prefix-cache block size in tokens (``None``: unknown)."""
        ...

    @property
    def kv_cache_tokens(self) -> int | None:
        """Prefix-cache capacity in tokens (``None``: unknown)."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache; ``False`` when the engine cannot."""
        ...


@dataclass(frozen=True)
class Sent:
    """One request as the engine served it."""

    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    answer: str
    predicted_cached: int | None = None
    """Cached tokens the prefix-cache model predicts for the same token ids."""

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @classmethod
    def timed(
        cls, started: float, first: float | None, ended: float, usage: CacheUsage, answer: str
    ) -> Sent:
        """A request sent at ``started`` (``time.perf_counter`` seconds) whose first
        token came at ``first`` (``None``: none before the end) and whose answer ended at
        ``ended``, with the engine's ``usage``."""
        return cls(
            ttft_s=(first or ended) - started,
            total_s=ended - started,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            answer=answer,
        )


def _p95(values: Sequence[float]) -> float:
    """The nearest-rank 95th percentile: the smallest value at least 95% of them are
    at or below."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.95 * len(ordered)) - 1))]


@dataclass(frozen=True)
class ArmRun:
    name: str
    sent: tuple[Sent, ...]
    reset: bool
    """Whether the engine's cache was emptied before this arm (before its pass, where
    the arms ran interleaved under salts)."""
    prefill_passes_s: tuple[float, ...] = ()
    """Every pass's prefill time when the arm was sent several times (this run is the
    median one); empty for a single pass."""

    @property
    def mean_ttft_s(self) -> float:
        return statistics.fmean(s.ttft_s for s in self.sent)

    @property
    def p95_ttft_s(self) -> float:
        return _p95([s.ttft_s for s in self.sent])

    @property
    def prefill_s(self) -> float:
        """Sum of the requests' TTFTs: the time spent before first tokens."""
        return sum(s.ttft_s for s in self.sent)

    @property
    def total_s(self) -> float:
        return sum(s.total_s for s in self.sent)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.sent)

    @property
    def cached_tokens(self) -> int:
        return sum(s.cached_tokens for s in self.sent)

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def predicted_computed(self) -> int | None:
        if any(s.predicted_cached is None for s in self.sent):
            return None
        return sum(s.prompt_tokens - (s.predicted_cached or 0) for s in self.sent)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": len(self.sent),
            "reset": self.reset,
            "mean_ttft_s": self.mean_ttft_s,
            "p95_ttft_s": self.p95_ttft_s,
            "prefill_s": self.prefill_s,
            "total_s": self.total_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "computed_tokens": self.computed_tokens,
            "predicted_computed_tokens": self.predicted_computed,
            "prefill_passes_s": list(self.prefill_passes_s),
        }


@dataclass(frozen=True)
class WorkloadRun:
    name: str
    description: str
    arms: tuple[ArmRun, ...]
    notes: tuple[str, ...] = field(default=())
    pairs: tuple[tuple[str, str], ...] = (("unmodified", "contextpilot"),)
    """(unmodified arm, optimized arm) pairs, as the workload named them."""

    def arm(self, name: str) -> ArmRun:
        return next(arm for arm in self.arms if arm.name == name)

    def baseline_of(self, name: str) -> ArmRun:
        """The unmodified arm ``name`` is compared with (the first arm when no pair
        names it; an unmodified arm is its own)."""
        for plain, ours in self.pairs:
            if name in (plain, ours):
                return self.arm(plain)
        return self.arms[0]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "arms": [arm.as_json() for arm in self.arms],
            "pairs": [list(pair) for pair in self.pairs],
            "notes": list(self.notes),
        }


def _root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1")


def engine_tokenizer(
    http: httpx.Client, base_url: str, model: str
) -> tuple[Tokenize, TokenizeText] | None:
    """The engine's own tokenizer: the chat template applied as for
    ``/v1/chat/completions`` (generation prompt included), and plain text (for the
    answers the engine generated). vLLM: ``POST /tokenize`` with ``messages``;
    llama-server: ``POST /apply-template``, then ``POST /tokenize`` of its prompt.
    ``None`` when the engine has neither."""
    root = _root(base_url)

    def tokens(path: str, body: dict[str, Any]) -> list[int]:
        response = http.post(f"{root}{path}", json=body)
        response.raise_for_status()
        found = response.json().get("tokens")
        if not isinstance(found, list):
            raise InvalidInputError(f"{root}{path} answered without 'tokens'")
        return [int(t) for t in found]

    def vllm_text(text: str) -> list[int]:
        return tokens("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})

    def vllm_chat(messages: Messages) -> list[int]:
        body = {"model": model, "messages": messages, "add_generation_prompt": True}
        return tokens("/tokenize", body)

    def llama_text(text: str, special: bool = False) -> list[int]:
        return tokens("/tokenize", {"content": text, "add_special": special})

    def llama_chat(messages: Messages) -> list[int]:
        response = http.post(f"{root}/apply-template", json={"messages": messages})
        response.raise_for_status()
        prompt = response.json().get("prompt")
        if not isinstance(prompt, str):
            raise InvalidInputError(f"{root}/apply-template answered without 'prompt'")
        return llama_text(prompt, special=True)

    for chat, text in ((vllm_chat, vllm_text), (llama_chat, llama_text)):
        try:
            if not text("probe"):
                continue  # an endpoint that ignored the request's fields
        except (httpx.HTTPError, InvalidInputError, ValueError):
            continue
        return chat, lambda answer, text=text: text(answer) if answer else []
    return None


def send_chat(
    http: httpx.Client,
    base_url: str,
    model: str,
    messages: Messages,
    *,
    max_tokens: int = 1,
    cache_salt: str | None = None,
) -> Sent:
    """Stream one chat completion; time its first token; read the engine's usage.
    ``cache_salt`` (vLLM) puts the request in a prefix-cache namespace of its own."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    report: Any = None
    with http.stream("POST", f"{base_url.rstrip('/')}/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    parts.append(delta["content"])
                if first is None and (delta.get("content") or choice.get("finish_reason")):
                    first = time.perf_counter()
            if chunk.get("usage") or chunk.get("timings"):
                report = chunk
    ended = time.perf_counter()
    if report is None:
        raise InvalidInputError("the engine streamed no usage (needs stream_options support)")
    return Sent.timed(started, first, ended, parse_cache_usage(report), "".join(parts))


def _no_tick() -> None:
    return None


def run_workload(
    engine: EngineTarget,
    workload: EngineWorkload,
    *,
    tokenize: tuple[Tokenize, TokenizeText] | None = None,
    use_engine_tokenizer: bool = True,
    on_arm: Callable[[str, int], Tick] | None = None,
    timeout_s: float = 600.0,
    repeats: int = 1,
    interleave: bool | None = None,
) -> WorkloadRun:
    """Send every arm of ``workload`` to ``engine``, each into an empty prefix cache.

    ``tokenize`` gives prompt token ids for the simulated prediction; by default the
    engine's own ``/tokenize`` is used when it has one (``use_engine_tokenizer``), and
    without token ids the prediction is left out. ``on_arm(name, total)`` returns a
    callback advanced once per request (progress display).

    ``interleave`` (default: on vLLM, which isolates caches by ``cache_salt``) sends
    the arms request by request in turn — request 0 of every arm, then request 1, the
    arm going first rotating — each arm under a salt of its own on one reset cache, so
    that a slow spell of the machine falls on every arm alike (they then share the
    cache's capacity: the prediction replays them through one cache model, salted
    apart, and a note says when they outgrew it); otherwise the arms run one after the
    other, the cache reset before each. ``repeats`` > 1 sends every arm
    that many times: the first pass as above, then replays of the prompts each arm sent
    (its generated answers included), the arms in reverse order on every other pass. An
    arm's reported run is its pass of median prefill time (:attr:`ArmRun.prefill_passes_s`
    holds every pass's)."""
    check_repeats(repeats)
    salted = getattr(engine, "kind", None) == "vllm" if interleave is None else interleave
    notes: list[str] = []
    with httpx.Client(timeout=timeout_s) as http:
        if tokenize is None and use_engine_tokenizer:
            tokenize = engine_tokenizer(http, engine.base_url, engine.model_name)
            if tokenize is None:
                notes.append("engine has no /tokenize: no simulated prediction")
        block_size = engine.block_size
        if tokenize is not None and block_size is None:
            notes.append("engine block size unknown: no simulated prediction")
            tokenize = None
        new_cache, note = prediction_cache(engine)
        if note:
            notes.append(note)
        if salted and len(workload.arms) > 1:
            notes.append(
                "arms interleaved request by request, each under its own cache_salt, "
                "on one engine cache"
            )
        sender = _PassSender(http, engine, notes, on_arm or (lambda name, total: _no_tick))
        _warm_up(http, engine)
        predictors = (
            _predictors(workload.arms, new_cache, shared=salted)
            if tokenize is not None and block_size is not None
            else {}
        )
        first = sender.first_pass(
            workload.arms, salted=salted, predictors=predictors, tokenize=tokenize
        )
        if salted and predictors:
            notes += _competition_note(next(iter(predictors.values())))
        passes = {run.name: [run] for run in first}
        for number in range(1, repeats):
            order = workload.arms if number % 2 == 0 else workload.arms[::-1]
            for run in sender.replay(order, number, salted=salted, first=first):
                passes[run.name].append(run)
    return WorkloadRun(
        workload.name,
        workload.description,
        tuple(median_pass(passes[arm.name]) for arm in workload.arms),
        tuple(dict.fromkeys(notes)),
        workload.pairs,
    )


def _predictors(
    arms: Sequence[Arm], new_cache: Callable[[], CacheModel], *, shared: bool
) -> dict[str, CacheModel]:
    """The prefix-cache model predicting each arm's cached tokens: the arms sent
    interleaved under salts share one engine cache, so they share one model (each arm's
    prompts salted as the engine salts them) and evict each other's blocks as the engine
    does; arms sent alone each have a model of their own."""
    if shared:
        return dict.fromkeys((arm.name for arm in arms), new_cache())
    return {arm.name: new_cache() for arm in arms}


def _competition_note(cache: CacheModel) -> list[str]:
    """A note where the interleaved arms' blocks outgrew the engine's cache: then each
    arm kept less than it would have alone, and the speed-ups are not those of one arm
    on the engine by itself."""
    if not cache.evicted_tokens:
        return []
    return [
        f"the interleaved arms' blocks outgrew the engine's cache ({cache.capacity_tokens:,} "
        f"tokens; {cache.evicted_tokens:,} evicted in the first pass, as predicted): the arms "
        "evicted each other's blocks; a larger KV cache (--kv-cache-gib) measures each arm "
        "as if alone"
    ]


def check_repeats(repeats: int) -> None:
    """:class:`ConfigError` unless ``repeats`` is a whole number of passes (>= 1)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")


_WARM_UP_WORDS = 400
_WARM_UP_TIMEOUT_S = 300.0


def _warm_up(http: httpx.Client, engine: EngineTarget) -> None:
    """A few throwaway requests before the first arm: an engine's first requests after
    start-up are slower than later ones, which would favour every arm but the first."""
    for n in (1, 2, 3):
        text = " ".join(f"warm-up {n} word {i}" for i in range(_WARM_UP_WORDS * n // 4))
        send_chat(http, engine.base_url, engine.model_name, [{"role": "user", "content": text}])


def reset_cache(engine: EngineTarget, http: httpx.Client | None = None) -> bool:
    """Empty the engine's prefix cache before an arm; ``False`` when it cannot be. On
    llama-server the reset is a restart, so the fresh process gets the warm-up the
    first arm had (its prompts share no prefix with any arm's); ``http``: the client to
    send it with (default: one of its own)."""
    reset = engine.reset_prefix_cache()
    if reset and getattr(engine, "kind", None) == "llama-server":
        if http is not None:
            _warm_up(http, engine)
        else:
            with httpx.Client(timeout=_WARM_UP_TIMEOUT_S) as own:
                _warm_up(own, engine)
    return reset


def not_reset_note(arm_name: str) -> str:
    """The note for an arm that began on a cache the engine could not reset."""
    return f"{arm_name}: the engine's cache could not be reset"


class _PassSender:
    """Sends passes of arms: a group of arms into one reset cache, interleaved under
    salts, or each arm alone into a reset cache; records what every arm sent."""

    def __init__(
        self,
        http: httpx.Client,
        engine: EngineTarget,
        notes: list[str],
        on_arm: Callable[[str, int], Tick],
    ) -> None:
        self._http, self._engine, self._notes, self._on_arm = http, engine, notes, on_arm
        self.prompts: dict[str, list[Messages]] = {}
        self._salt_run = secrets.token_hex(4)  # a rerun never reads an earlier run's cache

    def first_pass(
        self,
        arms: Sequence[Arm],
        *,
        salted: bool,
        predictors: dict[str, CacheModel],
        tokenize: tuple[Tokenize, TokenizeText] | None,
    ) -> list[ArmRun]:
        """Every arm once, its prompts recorded and each request's cached tokens
        predicted by the arm's ``predictors`` entry where there are token ids."""
        for arm in arms:
            self.prompts[arm.name] = []

        def predict(arm: Arm, i: int, messages: Messages, result: Sent) -> Sent:
            self.prompts[arm.name].append(messages)
            cache = predictors.get(arm.name)
            if cache is None or tokenize is None:
                return result
            ids = tokenize[0](messages)
            generated = tokenize[1](result.answer) if arm.max_tokens > 1 else []
            # a shared model keeps the arms apart as the engine's salts do
            salt = arm.name if salted else None
            predicted = cache.admit(salted_tokens(ids, salt), generated).cached_tokens
            return _with_prediction(result, predicted, len(ids), self._notes)

        return self._send(arms, 0, salted=salted, suffix="", finish=predict)

    def replay(
        self, arms: Sequence[Arm], number: int, *, salted: bool, first: Sequence[ArmRun]
    ) -> list[ArmRun]:
        """The first pass's prompts of ``arms`` sent again (pass ``number``, from 0);
        each request keeps the first pass's prediction (the same token ids)."""
        by_name = {run.name: run for run in first}
        replays = [FixedArm(a.name, tuple(self.prompts[a.name]), a.max_tokens) for a in arms]

        def keep(arm: Arm, i: int, messages: Messages, result: Sent) -> Sent:
            return replace(result, predicted_cached=by_name[arm.name].sent[i].predicted_cached)

        suffix = f" (pass {number + 1})"
        return self._send(replays, number, salted=salted, suffix=suffix, finish=keep)

    def _send(
        self,
        arms: Sequence[Arm],
        number: int,
        *,
        salted: bool,
        suffix: str,
        finish: Callable[[Arm, int, Messages, Sent], Sent],
    ) -> list[ArmRun]:
        """Pass ``number`` of ``arms`` (their progress labels end in ``suffix``); each
        request's result goes through ``finish`` before it is kept."""
        groups = [list(arms)] if salted else [[arm] for arm in arms]
        runs: list[ArmRun] = []
        for group in groups:
            reset = reset_cache(self._engine, self._http)
            if not reset:
                self._notes.append(not_reset_note(group[0].name))
            salts = [
                f"{self._salt_run}-{number}-{position}" if salted else None
                for position in range(len(group))
            ]
            sent = self._interleaved(group, salts, suffix, finish)
            runs += [ArmRun(arm.name, tuple(s), reset) for arm, s in zip(group, sent, strict=True)]
        return runs

    def _interleaved(
        self,
        group: Sequence[Arm],
        salts: Sequence[str | None],
        suffix: str,
        finish: Callable[[Arm, int, Messages, Sent], Sent],
    ) -> list[list[Sent]]:
        """Request ``i`` of every arm of ``group``, then ``i + 1``; the arm going first
        rotates with ``i``."""
        ticks = [self._on_arm(arm.name + suffix, len(arm)) for arm in group]
        sent: list[list[Sent]] = [[] for _ in group]
        for i in range(max(len(arm) for arm in group)):
            start = i % len(group)
            for j in (*range(start, len(group)), *range(start)):
                arm = group[j]
                if i >= len(arm):
                    continue
                messages = arm.messages(i)
                result = send_chat(
                    self._http,
                    self._engine.base_url,
                    self._engine.model_name,
                    messages,
                    max_tokens=arm.max_tokens,
                    cache_salt=salts[j],
                )
                arm.answered(i, result.answer)
                sent[j].append(finish(arm, i, messages, result))
                ticks[j]()
        return sent


def median_pass(runs: Sequence[ArmRun]) -> ArmRun:
    """The pass of median prefill time (the lower middle one of an even count), with
    every pass's prefill time (a single pass as it is)."""
    if len(runs) == 1:
        return runs[0]
    times = tuple(run.prefill_s for run in runs)
    middle = sorted(range(len(runs)), key=lambda i: times[i])[(len(runs) - 1) // 2]
    return replace(runs[middle], prefill_passes_s=times)


def prediction_cache(engine: EngineTarget) -> tuple[Callable[[], CacheModel], str]:
    """A factory of fresh models of ``engine``'s cache, replaying an arm's prompts to
    predict its cached tokens, and a note on the model where it is not the engine's own
    rules. vLLM (and an engine of unknown kind): its prefix cache at the engine's block
    size (1 where unknown; the suite then predicts nothing) and KV capacity.
    llama-server with one slot: :class:`~contextpilot_rag.sim.slot_cache.LlamaServerCacheModel`
    with the server's ``--cache-ram`` and ``--slot-prompt-similarity``. With several
    slots, an unbounded prefix cache: at most what the server reuses."""
    if getattr(engine, "kind", None) != "llama-server":
        block_size, capacity = engine.block_size or 1, engine.kv_cache_tokens
        return lambda: PrefixCacheModel(block_size=block_size, capacity_tokens=capacity), ""
    flags = list(getattr(engine, "flags", ()) or ())
    slots = _flag(flags, ("-np", "--parallel"), "1")
    if slots != "1":
        note = (
            f"llama-server with {slots} slots: predicted with an unbounded prefix cache, at "
            "most what it reuses (its slot and prompt-cache rules are modelled for one slot)"
        )
        return lambda: PrefixCacheModel(block_size=1, capacity_tokens=None), note
    cache_ram = _flag(flags, ("-cram", "--cache-ram"), "-1")
    similarity = float(_flag(flags, ("-sps", "--slot-prompt-similarity"), "0.1"))
    note = (
        "llama-server predicted with its slot and host-memory prompt cache (a prompt saved "
        "when the next keeps less than half of it, restored when that keeps at least a "
        "quarter; `contextpilot_rag.sim.slot_cache`)"
        + ("" if cache_ram != "0" else "; --cache-ram 0: the slot alone")
    )
    return (
        lambda: LlamaServerCacheModel(prompt_cache=cache_ram != "0", similarity=similarity),
        note,
    )


def _flag(flags: Sequence[str], names: Sequence[str], default: str) -> str:
    """The value after the last of ``names`` among ``flags`` (``default``: none)."""
    value = default
    for i, flag in enumerate(flags[:-1]):
        if flag in names:
            value = flags[i + 1]
    return value


def _with_prediction(sent: Sent, predicted: int, tokenized: int, notes: list[str]) -> Sent:
    if tokenized != sent.prompt_tokens:
        notes.append(
            f"tokenized prompt ({tokenized}) differs from the engine's count "
            f"({sent.prompt_tokens}) on some requests"
        )
    return replace(sent, predicted_cached=min(predicted, sent.prompt_tokens))


@dataclass(frozen=True)
class FamilyRun:
    """One workload shape over many seeds, in the simulated prefix cache only (at the
    engine's block size and capacity, with its tokenizer): per seed, the unmodified
    arm's computed prompt tokens over the optimized arm's, and the optimized arm's
    predicted hit ratio. The engine run stands for one seed; this shows how far that
    seed is from the family's worst."""

    name: str
    seeds: tuple[int, ...]
    reductions: tuple[float, ...]
    hit_ratios: tuple[float, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seeds": list(self.seeds),
            "reductions": list(self.reductions),
            "hit_ratios": list(self.hit_ratios),
        }


def simulate_family(
    name: str,
    build: Callable[[int], EngineWorkload],
    seeds: Sequence[int],
    tokenize: Tokenize,
    *,
    new_cache: Callable[[], CacheModel],
) -> FamilyRun:
    """Run each seed's workload (``build(seed)``) through a fresh model of the engine's
    cache per arm (``new_cache``, :func:`prediction_cache`), comparing its first pair
    of arms. An arm that generates answers (multi-turn) is
    given MTRAG's reference answers as its history, and the cache holds prompts only:
    the engine run's answers are its own."""
    reductions: list[float] = []
    hits: list[float] = []
    for seed in seeds:
        workload = build(seed)
        computed: list[int] = []
        total = 0
        for arm_name in workload.pairs[0]:
            arm = workload.arm(arm_name)
            cache = new_cache()
            total = computed_here = 0
            for i in range(len(arm)):
                ids = tokenize(arm.messages(i))
                total += len(ids)
                computed_here += len(ids) - cache.admit(ids, []).cached_tokens
                if arm.max_tokens > 1:
                    arm.answered(i, workload.requests[i].answer)
            computed.append(computed_here)
        reductions.append(computed[0] / max(1, computed[1]))
        hits.append(1 - computed[1] / max(1, total))
    return FamilyRun(name, tuple(seeds), tuple(reductions), tuple(hits))
