"""The cloud-cache cost benchmark (``contextpilot-rag bench --suite cloud``): what the
same requests cost in input tokens on a hosted API, sent unmodified with common caching
practices or as the pilot's prompts.

Every arm replays one :class:`~.cloud_workloads.CloudWorkload` in send order through a
fresh provider emulator (:mod:`contextpilot_rag.sim.provider_cache`, the providers'
published rules) at the request's simulated second, and bills each request's usage
with :func:`contextpilot_rag.cloud.input_cost` at one model's list price:

* **Anthropic** — ``system breakpoint``: the unmodified request (documents in
  retrieval order, every turn's documents kept in the conversation, each message one
  text block) with ``cache_control`` on the system prompt; ``system + last message
  breakpoints``: the same with one more on the last user message; ``contextpilot``:
  the pilot's prompt (reorder, de-duplication, notes) as :meth:`Prompt.to_anthropic`
  sends it, breakpoints where its cache plan put them.
* **OpenAI** (automatic caching) — ``no prompt_cache_key`` and ``per-user
  prompt_cache_key``: the unmodified messages; ``contextpilot``:
  :meth:`Prompt.to_openai_request` (the pilot's messages and key).

The baseline of a workload is its cheaper unmodified practice. Figures are emulated
from published rules, not measured on the providers' servers.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..blocks import ContextBlock
from ..cloud import (
    DEFAULT_PRICES,
    CloudCacheConfig,
    ModelPrice,
    ProviderRules,
    input_cost,
    rules_for,
)
from ..cloud.requests import cache_control_of
from ..errors import ConfigError
from ..experiment import baseline_config
from ..pilot import ContextPilot, PilotConfig
from ..prompt import Prompt
from ..sim.provider_cache import (
    AnthropicCacheModel,
    CacheBlock,
    ManualClock,
    OpenAIBreakpointCacheModel,
    OpenAICacheModel,
)
from ..sim.replay import synthetic_answer
from ..tokenizers import Tokenizer, default_tokenizer
from ..usage import InputTokens
from .cloud_bound import least_chat_append_costs, least_input_cost
from .cloud_workloads import FAMILIES, CloudWorkload, TimedRequest, cloud_workload

__all__ = [
    "ANTHROPIC_BASELINES",
    "DEFAULT_MODELS",
    "OPENAI_BASELINES",
    "OPENAI_BREAKPOINT_BASELINES",
    "OURS",
    "PROVIDERS",
    "ArmCost",
    "CloudRun",
    "CloudSuiteResult",
    "SentRequest",
    "replay_ours",
    "run_cloud_suite",
    "run_cloud_workload",
]

PROVIDERS = ("anthropic", "openai")
DEFAULT_MODELS: Mapping[str, str] = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5.4"}
OURS = "contextpilot"
ANTHROPIC_BASELINES = ("system breakpoint", "system + last message breakpoints")
OPENAI_BASELINES = ("no prompt_cache_key", "per-user prompt_cache_key")
OPENAI_BREAKPOINT_BASELINES = (
    "implicit breakpoint",
    "system breakpoint + implicit, per-user prompt_cache_key",
)
"""On ``gpt-5.6`` and later (:data:`~contextpilot_rag.cloud.OPENAI_BREAKPOINT_RULES`):
the request as it comes (OpenAI's implicit breakpoint at the latest message), or an
explicit breakpoint at the end of the system prompt besides it and a key per user (what
OpenAI's guide advises for a stable prefix)."""

Progress = Callable[[str, int], Callable[[], None]]


@dataclass(frozen=True)
class ArmCost:
    """One arm's replay: tokens as billed, their cost (USD, input side only) and the
    breakpoints its requests carried (Anthropic; 0 on OpenAI)."""

    name: str
    requests: int
    prompt_tokens: int
    uncached_tokens: int
    cache_read_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cost_usd: float
    breakpoints: int
    max_breakpoints: int

    @property
    def cache_write_tokens(self) -> int:
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def breakpoints_per_request(self) -> float:
        return self.breakpoints / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class CloudRun:
    """One workload on one provider: every arm, the baseline practices named."""

    family: str
    seed: int
    provider: str
    model: str
    description: str
    arms: tuple[ArmCost, ...]
    baselines: tuple[str, ...]
    least_cost_usd: float = 0.0  # :func:`~.cloud_bound.least_input_cost`; 0: not computed
    least_chat_cost_usd: float = 0.0  # :func:`~.cloud_bound.least_chat_append_cost`
    least_chat_own_cost_usd: float = 0.0  # the same, nothing read across conversations

    def arm(self, name: str) -> ArmCost:
        return next(arm for arm in self.arms if arm.name == name)

    @property
    def ours(self) -> ArmCost:
        return self.arm(OURS)

    @property
    def baseline(self) -> ArmCost:
        """The cheaper unmodified practice on this workload."""
        return min((self.arm(name) for name in self.baselines), key=lambda arm: arm.cost_usd)

    @property
    def ratio(self) -> float:
        """Baseline input cost / ours (> 1: ours is cheaper)."""
        return self.baseline.cost_usd / self.ours.cost_usd if self.ours.cost_usd else 0.0

    @property
    def bound(self) -> float:
        """Baseline input cost / the least any strategy could pay: the largest
        :attr:`ratio` reachable on this workload (0 when not computed)."""
        return self.baseline.cost_usd / self.least_cost_usd if self.least_cost_usd else 0.0

    @property
    def chat_bound(self) -> float:
        """Baseline input cost / the least a strategy whose turns extend the previous
        prompt could pay (0 when not computed)."""
        chat = self.least_chat_cost_usd
        return self.baseline.cost_usd / chat if chat else 0.0


@dataclass(frozen=True)
class CloudSuiteResult:
    runs: tuple[CloudRun, ...]
    seeds: Mapping[str, tuple[int, ...]]
    models: Mapping[str, str]
    scale: float
    elapsed_s: float = 0.0
    prices: tuple[ModelPrice, ...] = field(default=())

    def runs_of(self, family: str, provider: str) -> list[CloudRun]:
        return [run for run in self.runs if run.family == family and run.provider == provider]

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(p for p in PROVIDERS if any(run.provider == p for run in self.runs))


class _TokenCache:
    """Token ids of the texts requests are made of (content blocks, whole messages),
    each encoded once per workload. A message of several content blocks is the
    concatenation of its blocks' ids, so every arm counts the same text alike."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: dict[str, array[int]] = {}

    def ids(self, text: str) -> array[int]:
        found = self._ids.get(text)
        if found is None:
            found = array("i", self._tokenizer.encode(text))
            self._ids[text] = found
        return found

    def count(self, text: str) -> int:
        """The number of tokens of ``text``."""
        return len(self.ids(text))

    def learn(self, prompt: Prompt) -> None:
        """Encode ``prompt``'s messages from their content blocks."""
        for index, message in enumerate(prompt.messages):
            content = message["content"]
            if content in self._ids:
                continue
            joined: array[int] = array("i")
            for part in prompt.content_parts(index):
                joined.extend(self.ids(part))
            self._ids[content] = joined


@dataclass
class _Tally:
    name: str
    price: ModelPrice
    requests: int = 0
    tokens: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    cost_usd: float = 0.0
    breakpoints: int = 0
    max_breakpoints: int = 0

    def add(self, usage: InputTokens, breakpoints: int) -> None:
        self.requests += 1
        counts = (
            usage.uncached_tokens,
            usage.cache_read_tokens,
            usage.cache_write_5m_tokens,
            usage.cache_write_1h_tokens,
        )
        self.tokens = [a + b for a, b in zip(self.tokens, counts, strict=True)]
        self.cost_usd += input_cost(usage, self.price).total
        self.breakpoints += breakpoints
        self.max_breakpoints = max(self.max_breakpoints, breakpoints)

    def result(self) -> ArmCost:
        uncached, read, write_5m, write_1h = self.tokens
        total = uncached + read + write_5m + write_1h
        return ArmCost(
            self.name,
            self.requests,
            total,
            uncached,
            read,
            write_5m,
            write_1h,
            self.cost_usd,
            self.breakpoints,
            self.max_breakpoints,
        )


Shape = Callable[[Prompt, TimedRequest], dict[str, Any]]


def _anthropic_cache_blocks(
    request: Mapping[str, Any], tokens: _TokenCache, ttl_s: Mapping[str, float]
) -> list[CacheBlock]:
    """The cache blocks of Anthropic ``messages.create`` keyword arguments (``system``,
    ``messages``), as the API caches them: one per content block, in order."""
    messages = [("system", request.get("system", ()))]
    messages += [(message["role"], message["content"]) for message in request["messages"]]

    def ttl_of(part: Mapping[str, Any]) -> float | None:
        marker = part.get("cache_control")
        return None if marker is None else ttl_s[marker.get("ttl", "5m")]

    return _cache_blocks(messages, tokens, ttl_of)[0]


def _cache_blocks(
    messages: Iterable[tuple[str, Any]],
    tokens: _TokenCache,
    ttl_of: Callable[[Mapping[str, Any]], float | None],
) -> tuple[list[CacheBlock], int]:
    """One cache block per text part of each (role, content) (a string content is one
    part), keyed by role, place and text, its breakpoint's lifetime from ``ttl_of``;
    and the index of the block that ends the latest user or tool message (-1: none)."""
    blocks: list[CacheBlock] = []
    latest = -1
    for role, content in messages:
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for number, part in enumerate(parts):
            key = f"{role}\n{number == 0}\n{part['text']}"
            blocks.append(CacheBlock(key, len(tokens.ids(part["text"])), ttl_of(part)))
        if role in ("user", "tool") and parts:
            latest = len(blocks) - 1
    return blocks, latest


@dataclass(frozen=True)
class _Replayed:
    """One request an arm replayed: its breakpoints, its usage and what the emulator
    saw (Anthropic: the cache blocks; OpenAI: the token ids)."""

    breakpoints: int
    usage: InputTokens
    blocks: Sequence[CacheBlock] = ()
    ids: Sequence[int] = ()


class _AnthropicArm:
    def __init__(self, name: str, shape: Shape, model: str, tokens: _TokenCache) -> None:
        self.rules = rules_for("anthropic")
        self._shape, self._model, self._tokens = shape, model, tokens
        self._cache = AnthropicCacheModel(self.rules)
        self.tally = _Tally(name, DEFAULT_PRICES.price(model))

    def send(self, prompt: Prompt, timed: TimedRequest) -> _Replayed:
        return self.send_body(self._shape(prompt, timed), timed)

    def send_body(self, request: Mapping[str, Any], timed: TimedRequest) -> _Replayed:
        """Replay one request's keyword arguments at ``timed.at_s``."""
        blocks = _anthropic_cache_blocks(request, self._tokens, self.rules.ttl_s)
        marked = _breakpoints_within(blocks, self.rules, self.tally.name)
        usage = self._cache.request(blocks, now_s=timed.at_s, model=self._model)
        self.tally.add(usage, marked)
        return _Replayed(marked, usage, blocks=blocks)


class _OpenAIArm:
    def __init__(self, name: str, shape: Shape, model: str, tokens: _TokenCache) -> None:
        self._shape, self._model, self._tokens = shape, model, tokens
        self.rules = rules_for("openai", model)
        # the model's cache: gpt-5.6's breakpoints, or the older models' automatic one
        self._marked_cache = (
            OpenAIBreakpointCacheModel(self.rules) if self.rules.max_breakpoints else None
        )
        self._cache = OpenAICacheModel()
        self.tally = _Tally(name, DEFAULT_PRICES.price(model))

    def send(self, prompt: Prompt, timed: TimedRequest) -> _Replayed:
        return self.send_body(self._shape(prompt, timed), timed)

    def send_body(self, request: Mapping[str, Any], timed: TimedRequest) -> _Replayed:
        """Replay one request's keyword arguments at ``timed.at_s``: on the automatic
        cache (no breakpoints), or on ``gpt-5.6``'s (its ``prompt_cache_breakpoint``
        markers, and the implicit one unless ``prompt_cache_options`` asks for none)."""
        if self._marked_cache is not None:
            return self._send_marked(request, timed, self._marked_cache)
        ids = _openai_ids(request, self._tokens)
        usage = self._cache.request(
            ids,
            now_s=timed.at_s,
            prompt_cache_key=request.get("prompt_cache_key"),
            retention=request.get("prompt_cache_retention"),
            model=self._model,
        ).input_tokens
        self.tally.add(usage, 0)
        return _Replayed(0, usage, ids=ids)

    def _send_marked(
        self, request: Mapping[str, Any], timed: TimedRequest, cache: OpenAIBreakpointCacheModel
    ) -> _Replayed:
        blocks, implicit = _openai_cache_blocks(request, self._tokens, self.rules.ttl_s)
        marked = _breakpoints_within(blocks, self.rules, self.tally.name)
        options = request.get("prompt_cache_options") or {}
        explicit = options.get("mode") == "explicit" or implicit < 0
        usage = cache.request(
            blocks,
            now_s=timed.at_s,
            prompt_cache_key=request.get("prompt_cache_key"),
            model=self._model,
            implicit_block=None if explicit else implicit,
        ).tokens
        self.tally.add(usage, marked)
        return _Replayed(marked, usage, blocks=blocks)


def _breakpoints_within(blocks: Sequence[CacheBlock], rules: ProviderRules, arm: str) -> int:
    """The breakpoints ``blocks`` carry, checked against the rules' limit (a benchmark
    arm that sends more is a defect of the arm, not a workload)."""
    marked = sum(block.breakpoint_ttl_s is not None for block in blocks)
    if marked > rules.max_breakpoints:
        raise AssertionError(f"{arm}: {marked} breakpoints in one request")
    return marked


def _arm(
    provider: str, name: str, shape: Shape, model: str, tokens: _TokenCache
) -> _AnthropicArm | _OpenAIArm:
    """An arm replaying ``shape``'s requests on ``provider``'s emulator."""
    if provider == "anthropic":
        return _AnthropicArm(name, shape, model, tokens)
    return _OpenAIArm(name, shape, model, tokens)


def _openai_cache_blocks(
    request: Mapping[str, Any], tokens: _TokenCache, ttl_s: Mapping[str, float]
) -> tuple[list[CacheBlock], int]:
    """The cache blocks of an OpenAI request's ``messages``, ``prompt_cache_breakpoint``
    marking a breakpoint with the rules' lifetime, and the index of the block that ends
    the latest user or tool message (where OpenAI's implicit breakpoint goes)."""
    ttl = next(iter(ttl_s.values()))
    messages = [(message["role"], message["content"]) for message in request["messages"]]
    return _cache_blocks(
        messages, tokens, lambda part: ttl if part.get("prompt_cache_breakpoint") else None
    )


def _openai_ids(request: Mapping[str, Any], tokens: _TokenCache) -> array[int]:
    """The token ids of an OpenAI request's messages, each after a role marker."""
    ids: array[int] = array("i")
    for message in request["messages"]:
        ids.extend(tokens.ids(f"<|{message['role']}|>\n"))
        ids.extend(tokens.ids(message["content"]))
    return ids


def _unmodified_anthropic(mark_last: bool, ttl: str = "5m") -> Shape:
    """The unmodified messages, one text block each, the system prompt marked (and the
    last user message when ``mark_last``), with the lifetime ``ttl``."""

    def shape(prompt: Prompt, timed: TimedRequest) -> dict[str, Any]:
        marker = cache_control_of(ttl)
        system = [m["content"] for m in prompt.messages if m["role"] == "system"]
        turns: list[dict[str, Any]] = [
            {"role": m["role"], "content": m["content"]}
            for m in prompt.messages
            if m["role"] != "system"
        ]
        if mark_last:
            last = turns[-1]["content"]
            turns[-1]["content"] = [{"type": "text", "text": last, "cache_control": marker}]
        request: dict[str, Any] = {"messages": turns}
        if system:
            request["system"] = [{"type": "text", "text": system[0], "cache_control": marker}]
        return request

    return shape


def _unmodified_openai(per_user_key: bool, mark_system: bool = False) -> Shape:
    """The unmodified messages, with a key per user when ``per_user_key``, and an
    explicit ``gpt-5.6`` breakpoint at the end of the system prompt when
    ``mark_system``."""

    def shape(prompt: Prompt, timed: TimedRequest) -> dict[str, Any]:
        messages: list[dict[str, Any]] = prompt.to_openai()
        if mark_system and messages and messages[0]["role"] == "system":
            text = messages[0]["content"]
            part = {"type": "text", "text": text, "prompt_cache_breakpoint": {"mode": "explicit"}}
            messages[0] = {"role": "system", "content": [part]}
        request: dict[str, Any] = {"messages": messages}
        if per_user_key:
            request["prompt_cache_key"] = timed.user
        return request

    return shape


def _to_anthropic(prompt: Prompt, timed: TimedRequest) -> dict[str, Any]:
    return prompt.to_anthropic()


def _to_openai(prompt: Prompt, timed: TimedRequest) -> dict[str, Any]:
    return prompt.to_openai_request()


_OURS_SHAPES: Mapping[str, Shape] = {"anthropic": _to_anthropic, "openai": _to_openai}
"""How the pilot's prompt is sent, per provider."""


def _practices(provider: str, model: str | None = None) -> tuple[str, ...]:
    """The names of ``provider``'s two common practices (for ``model``), the
    baseline's candidates."""
    if provider == "anthropic":
        return ANTHROPIC_BASELINES
    if _has_breakpoints(provider, model):
        return OPENAI_BREAKPOINT_BASELINES
    return OPENAI_BASELINES


def _has_breakpoints(provider: str, model: str | None) -> bool:
    return provider == "openai" and rules_for(provider, model).max_breakpoints > 0


def _arm_shapes(
    provider: str, ttl: str = "5m", model: str | None = None
) -> list[tuple[str, Shape, bool]]:
    """(name, shape, sends the pilot's prompts) of every arm on ``provider`` (for
    ``model``): the two common practices on the unmodified prompts, then ours."""
    if provider == "anthropic":
        shapes = [_unmodified_anthropic(mark_last, ttl) for mark_last in (False, True)]
    elif _has_breakpoints(provider, model):
        shapes = [_unmodified_openai(False), _unmodified_openai(True, mark_system=True)]
    else:
        shapes = [_unmodified_openai(per_user) for per_user in (False, True)]
    practices = zip(_practices(provider, model), shapes, strict=True)
    return [
        *((name, shape, False) for name, shape in practices),
        (OURS, _OURS_SHAPES[provider], True),
    ]


def _prompts(
    workload: CloudWorkload, config: PilotConfig, tokenizer: Tokenizer
) -> Iterator[tuple[Prompt, TimedRequest]]:
    """The pilot's prompts for ``workload``, built in send order at each request's
    simulated second (a conversation's answer recorded right away)."""
    clock = ManualClock()
    pilot = ContextPilot(config, tokenizer=tokenizer, clock=clock)
    blocks = {doc_id: ContextBlock(text, id=doc_id) for doc_id, text in workload.corpus.items()}
    for timed in workload.requests:
        clock.advance(max(0.0, timed.at_s - clock.now_s))
        request = timed.request
        prompt = pilot.optimize(
            [blocks[doc_id] for doc_id in request.doc_ids],
            request.query,
            conversation_id=request.session,
            system=workload.system_prompt,
        )
        if request.session is not None:
            pilot.record_answer(prompt, synthetic_answer(request))
        yield prompt, timed


def _replay(
    prompts: Iterable[tuple[Prompt, TimedRequest]],
    arms: Sequence[_AnthropicArm | _OpenAIArm],
    tokens: _TokenCache,
    tick: Callable[[], None],
) -> None:
    for prompt, timed in prompts:
        tokens.learn(prompt)
        for arm in arms:
            arm.send(prompt, timed)
        tick()


def _pilot_config(provider: str, model: str, ttl: str = "5m") -> PilotConfig:
    rules = rules_for(provider, model)
    lifetime = ttl if ttl in rules.ttl_s else ""  # "1h" is Anthropic's: OpenAI plans its own
    return PilotConfig(cloud=CloudCacheConfig(enabled=True, rules=rules, model=model, ttl=lifetime))


def _baseline_arms(
    providers: Sequence[str], models: Mapping[str, str], tokens: _TokenCache, ttl: str = "5m"
) -> list[_AnthropicArm | _OpenAIArm]:
    return [
        _arm(provider, name, shape, models[provider], tokens)
        for provider in PROVIDERS
        if provider in providers
        for name, shape, ours in _arm_shapes(provider, ttl, models[provider])
        if not ours
    ]


def run_cloud_workload(
    workload: CloudWorkload,
    providers: Sequence[str] = PROVIDERS,
    models: Mapping[str, str] = DEFAULT_MODELS,
    *,
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
    ttl: str = "5m",
) -> list[CloudRun]:
    """Every arm of ``workload`` on each of ``providers``, one :class:`CloudRun` per
    provider. ``ttl``: the Anthropic breakpoints' lifetime, in the baselines' markers
    and the pilot's plan alike (OpenAI's cache offers no choice); one Anthropic does not
    offer is a :class:`ConfigError` before anything runs."""
    rules_for("anthropic").check_ttl(ttl)
    tokenizer = tokenizer or default_tokenizer()
    tokens = _TokenCache(tokenizer)
    label = f"{workload.family} seed {workload.seed}"
    baselines = _baseline_arms(providers, models, tokens, ttl)
    # the baseline pilot plans with cloud rules on only so its messages split into the
    # same content blocks as ours (token counts alike); its plan is not sent
    unmodified = baseline_config(_pilot_config("anthropic", models.get("anthropic", "")))
    prompts = _prompts(workload, unmodified, tokenizer)
    _replay(prompts, baselines, tokens, _ticker(progress, f"{label}: unmodified", workload))
    ours: dict[str, _AnthropicArm | _OpenAIArm] = {}
    for provider in providers:
        model = models[provider]
        arm = _arm(provider, OURS, _OURS_SHAPES[provider], model, tokens)
        prompts = _prompts(workload, _pilot_config(provider, model, ttl), tokenizer)
        _replay(prompts, [arm], tokens, _ticker(progress, f"{label}: ours, {provider}", workload))
        ours[provider] = arm
    return [
        _run(workload, provider, models[provider], baselines, ours[provider], tokens)
        for provider in providers
    ]


def _run(
    workload: CloudWorkload,
    provider: str,
    model: str,
    baselines: Sequence[_AnthropicArm | _OpenAIArm],
    ours: _AnthropicArm | _OpenAIArm,
    tokens: _TokenCache,
) -> CloudRun:
    names = _practices(provider, model)
    arms = [arm.tally.result() for arm in baselines if arm.tally.name in names]
    least = least_input_cost(workload, ours.tally.price, tokens.count)
    chat, own = least_chat_append_costs(
        workload,
        ours.tally.price,
        tokens.count,
        min_prefix_tokens=rules_for(provider, model).min_tokens(model),
    )
    return CloudRun(
        workload.family,
        workload.seed,
        provider,
        model,
        workload.description,
        (*arms, ours.tally.result()),
        names,
        least,
        chat,
        own,
    )


@dataclass(frozen=True)
class SentRequest:
    """One of the pilot's requests as a provider emulator saw it: the workload's
    request, its usage and input cost, and what was sent. Anthropic: ``blocks``, its
    content blocks in order (the emulator's key, which names the role and the text, and
    its tokens; the system prompt first). OpenAI: ``ids``, the prompt's token ids (role
    markers included), and ``prompt_cache_key``."""

    timed: TimedRequest
    usage: InputTokens
    cost_usd: float
    blocks: tuple[tuple[str, int], ...] = ()
    ids: tuple[int, ...] = ()
    prompt_cache_key: str | None = None


def replay_ours(
    workload: CloudWorkload,
    provider: str = "anthropic",
    model: str | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    ttl: str = "5m",
) -> list[SentRequest]:
    """The ``contextpilot`` arm of :func:`run_cloud_workload` on ``provider``'s rules
    (``model``: its default model), request by request (the same prompts, emulator and
    prices), for analyses of where its cost goes."""
    if provider not in PROVIDERS:
        raise ConfigError(f"provider must be one of {', '.join(PROVIDERS)}; got {provider!r}")
    model = model or DEFAULT_MODELS[provider]
    tokenizer = tokenizer or default_tokenizer()
    tokens = _TokenCache(tokenizer)
    shape = _OURS_SHAPES[provider]
    arm = _arm(provider, OURS, shape, model, tokens)
    sent: list[SentRequest] = []
    for prompt, timed in _prompts(workload, _pilot_config(provider, model, ttl), tokenizer):
        tokens.learn(prompt)
        body = shape(prompt, timed)
        replayed = arm.send_body(body, timed)
        sent.append(
            SentRequest(
                timed,
                replayed.usage,
                input_cost(replayed.usage, arm.tally.price).total,
                blocks=tuple((block.key, block.tokens) for block in replayed.blocks),
                ids=tuple(replayed.ids),
                prompt_cache_key=body.get("prompt_cache_key"),
            )
        )
    return sent


def _ticker(progress: Progress | None, label: str, workload: CloudWorkload) -> Callable[[], None]:
    if progress is None:
        return lambda: None
    return progress(label, len(workload.requests))


def run_cloud_suite(
    providers: Sequence[str] = PROVIDERS,
    *,
    seeds: Mapping[str, Sequence[int]] | None = None,
    scale: float = 1.0,
    models: Mapping[str, str] = DEFAULT_MODELS,
    progress: Progress | None = None,
) -> CloudSuiteResult:
    """Every family of :data:`~.cloud_workloads.FAMILIES` for its seeds (default: 0–7
    for multi-turn, two per re-retrieval share; 0–5 otherwise; each seed draws its
    arrival rate) on ``providers``."""
    unknown = sorted(set(providers) - set(PROVIDERS))
    if unknown or not providers:
        raise ConfigError(f"providers must be among {', '.join(PROVIDERS)}; got {list(providers)}")
    chosen = {family: tuple(range(8 if family == "multi-turn" else 6)) for family in FAMILIES}
    chosen.update({family: tuple(s) for family, s in (seeds or {}).items()})
    tokenizer = default_tokenizer()
    started = time.perf_counter()
    runs: list[CloudRun] = []
    for family, family_seeds in chosen.items():
        for seed in family_seeds:
            workload = cloud_workload(family, seed, scale)
            runs += run_cloud_workload(
                workload, providers, models, tokenizer=tokenizer, progress=progress
            )
    prices = tuple(DEFAULT_PRICES.price(models[provider]) for provider in providers)
    return CloudSuiteResult(
        tuple(runs), chosen, dict(models), scale, time.perf_counter() - started, prices
    )
