"""Trace loaders: turn request traces into :class:`RouteRequest` lists for the fleet
simulator.

- :func:`load_mooncake`: the Mooncake trace format (``timestamp`` ms,
  ``input_length``, ``output_length``, ``hash_ids`` of 512-token chained blocks).
- :func:`load_scbench_kv`: SCBench-style KV lookups (``{id, context, multi_turns:
  [{input, answer}]}``); one request per turn, prompted with SCBench's template, the
  turns of a record sharing its context as a prefix (and a session).
- :func:`conversation_trace`: a generated multi-turn conversation trace of the shape
  Mooncake publishes for its FAST'25 conversation workload (an hour of requests, long
  inputs, sessions whose later turns extend earlier ones), for families of traces.
- :func:`from_workload`: a workload of requests (e.g. the core's benchmark workloads,
  online / multi-turn) through a prompt builder (an arm of :mod:`.replay`). Any object
  with a ``name`` and ``requests`` that carry a ``session`` will do
  (:class:`WorkloadLike`), so this layer imports no benchmark code.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .._json_lines import json_object
from ..errors import ConfigError, InvalidInputError
from ..routing.types import RouteRequest
from ..tokenizers import Tokenizer, default_tokenizer
from .block_hashes import chained_block_hashes

Messages = Sequence[Mapping[str, str]]

__all__ = [
    "SCBENCH_PROMPT",
    "SessionRequest",
    "WorkloadLike",
    "chained_block_hashes",
    "conversation_trace",
    "detect_language",
    "from_workload",
    "length_bucket",
    "load_mooncake",
    "load_scbench_kv",
]

SCBENCH_PROMPT = (
    "Extract the value corresponding to the specified key in the JSON object below."
    "\n\n{context}\n\n{input}"
)
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_TOKEN_COUNT_FIELDS = ("prompt_tokens", "input_length", "num_tokens")


def _json_lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json_object(line, InvalidInputError)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{path}:{line_no}: {exc}") from None
            yield line_no, record


def _field(record: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = record.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidInputError(f"{where}: field {name!r} missing or of the wrong type")
    return value


def load_mooncake(
    path: str | Path, *, limit: int | None = None, block_tokens: int = 512
) -> list[RouteRequest]:
    """Requests of a Mooncake-format ``.jsonl`` trace, in file order.

    ``arrival_s = timestamp / 1000``; ``block_hashes`` are the trace's ``hash_ids``
    (already chained: equal ids mean equal prefixes) and every block end is a known
    boundary. ``limit`` keeps the first requests only."""
    if block_tokens < 1:
        raise ConfigError(f"block_tokens must be >= 1, got {block_tokens}")
    requests: list[RouteRequest] = []
    for line_no, record in _json_lines(path):
        if limit is not None and len(requests) >= limit:
            break
        where = f"{path}:{line_no}"
        hash_ids = _field(record, "hash_ids", list, where)
        if not all(isinstance(h, int) for h in hash_ids):
            raise InvalidInputError(f"{where}: 'hash_ids' must be integers")
        requests.append(
            RouteRequest(
                request_id=f"mooncake-{len(requests)}",
                prompt_tokens=_field(record, "input_length", int, where),
                block_hashes=tuple(hash_ids),
                block_tokens=block_tokens,
                expected_output_tokens=_field(record, "output_length", int, where),
                boundaries=tuple(range(1, len(hash_ids) + 1)),
                arrival_s=_field(record, "timestamp", (int, float), where) / 1000.0,
            )
        )
    return requests


def detect_language(text: str) -> str:
    """``"en"`` for latin-script text, ``"ja"`` for CJK text with kana (at least a
    tenth of its CJK characters), ``"zh"`` for other CJK text. Text counts as CJK when
    at least a tenth of its non-space characters are kana or Han ideographs."""
    kana = len(_KANA.findall(text))
    cjk = kana + len(_HAN.findall(text))
    visible = sum(1 for ch in text if not ch.isspace())
    if cjk == 0 or cjk * 10 < visible:
        return "en"
    return "ja" if kana * 10 >= cjk else "zh"


def length_bucket(tokens: int) -> str:
    """The smallest of 4k, 8k, 16k, 32k, 64k holding ``tokens`` (``"64k+"`` above)."""
    for limit_k in (4, 8, 16, 32, 64):
        if tokens <= limit_k * 1024:
            return f"{limit_k}k"
    return "64k+"


def _token_count(record: dict[str, Any], fallback: int) -> int:
    for name in _TOKEN_COUNT_FIELDS:
        value = record.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return fallback


def load_scbench_kv(
    path: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    block_tokens: int = 16,
    interarrival_s: float = 0.5,
) -> list[RouteRequest]:
    """One request per ``multi_turns`` entry of an SCBench KV-lookup ``.jsonl``.

    The prompt is SCBench's template around the record's context and the turn's
    input, tokenized with ``tokenizer`` (default: the core's default tokenizer, a
    character estimate when no offline tokenizer is installed); ``block_hashes`` are
    its chained ``block_tokens``-token blocks, so the turns of one record share their
    context blocks. ``prompt_tokens`` is the record's token count when it carries one
    (``prompt_tokens`` / ``input_length`` / ``num_tokens``), else the tokenized
    length. ``session`` is the record id; ``expected_output_tokens`` the answer's
    length; features are ``language``, ``length_bucket`` and ``task="kv"``. Requests
    arrive every ``interarrival_s`` seconds in file order."""
    if block_tokens < 1 or interarrival_s < 0:
        raise ConfigError("block_tokens must be >= 1 and interarrival_s >= 0")
    tok = tokenizer if tokenizer is not None else default_tokenizer()
    requests: list[RouteRequest] = []
    for line_no, record in _json_lines(path):
        where = f"{path}:{line_no}"
        context = _field(record, "context", str, where)
        record_id = str(record.get("id", line_no))
        context_ids = tok.encode(SCBENCH_PROMPT.split("{input}")[0].format(context=context))
        context_hashes = chained_block_hashes(context_ids, block_tokens)
        for turn_no, turn in enumerate(_field(record, "multi_turns", list, where)):
            if not isinstance(turn, dict) or not isinstance(turn.get("input"), str):
                raise InvalidInputError(f"{where}: turn {turn_no} needs a string 'input'")
            requests.append(
                _scbench_request(
                    tok,
                    record,
                    context,
                    context_hashes,
                    turn,
                    f"scbench-{record_id}",
                    turn_no,
                    block_tokens,
                )
            )
    return [_with_arrival(r, i * interarrival_s) for i, r in enumerate(requests)]


def _scbench_request(
    tok: Tokenizer,
    record: dict[str, Any],
    context: str,
    context_hashes: tuple[int, ...],
    turn: dict[str, Any],
    session: str,
    turn_no: int,
    block_tokens: int,
) -> RouteRequest:
    text = SCBENCH_PROMPT.format(context=context, input=turn["input"])
    token_ids = tok.encode(text)
    block_hashes = chained_block_hashes(token_ids, block_tokens)
    prompt_tokens = _token_count(record, len(token_ids))
    answer = turn.get("answer")
    request_id = f"{session}-{turn_no}"
    return RouteRequest(
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        block_hashes=block_hashes,
        block_tokens=block_tokens,
        expected_output_tokens=max(tok.count(answer), 1) if isinstance(answer, str) else 32,
        boundaries=_boundaries(context_hashes, block_hashes),
        session=session,
        features={
            "language": detect_language(text),
            "length_bucket": length_bucket(prompt_tokens),
            "task": "kv",
        },
        logical_id=request_id,
    )


def _boundaries(context_hashes: Sequence[int], block_hashes: Sequence[int]) -> tuple[int, ...]:
    """The end of the shared context (the blocks the prompt has in common with the
    tokenized template head + context) and the end of the prompt's full blocks."""
    shared = 0
    for ours, theirs in zip(context_hashes, block_hashes, strict=False):
        if ours != theirs:
            break
        shared += 1
    return tuple(sorted({b for b in (shared, len(block_hashes)) if b > 0}))


def _with_arrival(request: RouteRequest, arrival_s: float) -> RouteRequest:
    return replace(request, arrival_s=arrival_s)


class SessionRequest(Protocol):
    """A workload request as :func:`from_workload` reads it: its conversation (or
    ``None``)."""

    @property
    def session(self) -> str | None: ...


Item = TypeVar("Item", bound=SessionRequest, covariant=True)


class WorkloadLike(Protocol[Item]):
    """A named sequence of requests (``bench.workloads.Workload`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def requests(self) -> Sequence[Item]: ...


def from_workload(
    workload: WorkloadLike[Item],
    build: Callable[[Item], Messages],
    encode: Callable[[Messages], Sequence[int]],
    *,
    block_tokens: int = 16,
    interarrival_s: float = 0.05,
    output_tokens: int = 32,
) -> list[RouteRequest]:
    """Requests of a core benchmark workload, in workload order.

    ``build`` renders each request's chat messages (e.g. a replay arm: baseline or
    ContextPilot-optimized), ``encode`` turns messages into token ids as the engine
    sees them (e.g. :class:`~.replay.EngineTokenizer`). Block hashes chain
    the full ``block_tokens`` blocks; boundaries are the end of every message but the
    last (aligned down to a block) and the end of the prompt's full blocks. Sessions
    are the workload's conversation ids; request ``i`` arrives at
    ``i * interarrival_s``."""
    if block_tokens < 1 or interarrival_s < 0 or output_tokens < 1:
        raise ConfigError("block_tokens and output_tokens must be >= 1, interarrival_s >= 0")
    requests = []
    for i, item in enumerate(workload.requests):
        messages = build(item)
        token_ids = encode(messages)
        head_blocks = len(encode(messages[:-1])) // block_tokens if len(messages) > 1 else 0
        block_hashes = chained_block_hashes(token_ids, block_tokens)
        requests.append(
            RouteRequest(
                request_id=f"{workload.name}-{i}",
                prompt_tokens=len(token_ids),
                block_hashes=block_hashes,
                block_tokens=block_tokens,
                expected_output_tokens=output_tokens,
                boundaries=tuple(sorted({b for b in (head_blocks, len(block_hashes)) if b > 0})),
                session=item.session,
                arrival_s=i * interarrival_s,
            )
        )
    return requests


def conversation_trace(
    *,
    seed: int = 0,
    n_requests: int = 12_031,
    duration_s: float = 3600.0,
    mean_input_tokens: float = 12_035.0,
    mean_output_tokens: float = 343.0,
    mean_turns: float = 1.7,
    max_turns: int = 10,
    think_s: float = 120.0,
    think_spread: float | None = 1.0,
    apps: int = 1,
    app_prefix_tokens: tuple[int, int] = (512, 512),
    spread: float = 1.3,
    follow_up_tokens: float | None = 30.0,
    paste_share: float = 0.15,
    short_answer_share: float = 0.2,
    answer_shape: float = 4.0,
    max_output_tokens: int | None = 2000,
    lead_s: float | None = None,
    max_input_tokens: int | None = 128_000,
    block_tokens: int = 512,
) -> list[RouteRequest]:
    """A multi-turn conversation trace of the shape of Mooncake's published FAST'25
    conversation trace (``conversation_trace.jsonl``: 12,031 requests in an hour, mean
    input 12,035 and output 343 tokens, 512-token blocks, about 37% of them reused),
    ordered by arrival; the defaults follow that trace.

    The trace is a window of ``duration_s`` cut from a steady stream: sessions start
    uniformly from ``lead_s`` before the window (``None``: one ``duration_s``) to its
    end, so it opens with later turns of sessions begun before it (their earlier
    prompts not in the trace), and it holds the first ``n_requests`` requests from the
    window's start (about ``duration_s`` of them; ``lead_s=0``: sessions start inside
    the window and the trace ends where the requests run out). Each session has a geometric
    number of turns (mean ``mean_turns``, at most ``max_turns``). A later turn comes
    a think time after the previous one: log-normal with median ``think_s`` and log
    standard deviation ``think_spread`` (``None``: exponential with mean ``think_s``).
    A session belongs to one of ``apps`` applications (Zipf popularity) whose system
    prompt (``app_prefix_tokens`` range) every session of the app shares; a later
    turn's prompt is the previous prompt, the previous answer and a new message, so its
    block hashes extend the previous turn's.

    First messages are log-normal (``spread``: the log standard deviation), scaled so
    the mean input is ``mean_input_tokens``. A follow-up message is short (log-normal,
    median ``follow_up_tokens``, log standard deviation 1) except for a ``paste_share``
    of them, drawn like first messages; ``follow_up_tokens=None`` draws every follow-up
    like a first message. Answers: a ``short_answer_share`` of short ones (exponential,
    mean 32 tokens), the others gamma-distributed with shape ``answer_shape`` (1:
    exponential), scaled so the mean answer is ``mean_output_tokens``, and capped at
    ``max_output_tokens``. A prompt never exceeds the context window
    ``max_input_tokens``: a first message is cut to fit, and a session whose next turn
    would not fit ends. Block hashes are chained ids as in the Mooncake format (equal
    id = equal prefix up to that block; ``ceil(prompt / block_tokens)`` of them, a
    partial last block's never shared); every full block's end is a boundary.
    Deterministic in its arguments."""
    _ConversationArguments(
        n_requests=n_requests, duration_s=duration_s, block_tokens=block_tokens, apps=apps,
        mean_turns=mean_turns, max_turns=max_turns, mean_input_tokens=mean_input_tokens,
        mean_output_tokens=mean_output_tokens, think_s=think_s, think_spread=think_spread,
        spread=spread, app_prefix_tokens=app_prefix_tokens, follow_up_tokens=follow_up_tokens,
        paste_share=paste_share, short_answer_share=short_answer_share,
        answer_shape=answer_shape, max_output_tokens=max_output_tokens, lead_s=lead_s,
        max_input_tokens=max_input_tokens,
    )  # fmt: skip
    window = math.inf if max_input_tokens is None else max_input_tokens
    lead = duration_s if lead_s is None else lead_s
    low, high = app_prefix_tokens
    rng = random.Random(seed)
    app_weights = [1.0 / (rank + 1) for rank in range(apps)]
    app_prefix = [rng.randint(low, high) for _ in range(apps)]
    # enough sessions that about n_requests fall in the window (5% to spare)
    wanted = n_requests if not lead else math.ceil(n_requests * 1.05 * (1.0 + lead / duration_s))
    sessions = _sessions(rng, wanted, mean_turns, max_turns)
    # messages before scaling: (the part scaled to the mean input, a fixed part)
    shapes = [_messages(rng, turns, spread, follow_up_tokens, paste_share) for turns in sessions]
    answer = _AnswerLengths(mean_output_tokens, short_answer_share, answer_shape)
    outputs = [[answer.draw(rng, max_output_tokens) for _ in range(t)] for t in sessions]
    scale = _message_scale(sessions, shapes, outputs, app_prefix, mean_input_tokens)
    if max_input_tokens is not None:
        scale = _capped_message_scale(shapes, outputs, app_prefix, mean_input_tokens, window, scale)
    hashes = _HashIds()
    app_blocks = [hashes.fresh(size // block_tokens) for size in app_prefix]
    requests: list[RouteRequest] = []
    for number, turns in enumerate(sessions):
        app = rng.choices(range(apps), weights=app_weights)[0]
        at = rng.uniform(-lead, duration_s)
        prompt = app_prefix[app]
        blocks = list(app_blocks[app])
        for turn in range(turns):
            if turn:
                at += _think_time(rng, think_s, think_spread)
                prompt += round(outputs[number][turn - 1])
            scaled, fixed = shapes[number][turn]
            prompt += max(1, round(scaled * scale + fixed))
            if prompt > window:
                if turn:
                    break  # the context window is full: the conversation ends
                prompt = int(window)
            full = prompt // block_tokens
            blocks += hashes.fresh(full - len(blocks))
            # a partial last block gets an id of its own, as Mooncake's traces give
            # ceil(input / block) ids: the simulators recompute the last id's block,
            # which must be the partial one, not the last full one (cached)
            partial = hashes.fresh(1) if prompt % block_tokens else []
            requests.append(
                RouteRequest(
                    request_id=f"conversation-{number}-{turn}",
                    prompt_tokens=prompt,
                    block_hashes=(*blocks, *partial),
                    block_tokens=block_tokens,
                    expected_output_tokens=max(1, round(outputs[number][turn])),
                    boundaries=tuple(range(1, full + 1)),
                    session=f"conversation-{number}",
                    arrival_s=at,
                )
            )
    requests.sort(key=lambda r: r.arrival_s)
    return [r for r in requests if r.arrival_s >= 0.0][:n_requests]


@dataclass(frozen=True)
class _ConversationArguments:
    """The arguments of :func:`conversation_trace`, checked on construction: a
    :class:`ConfigError` for any out of range."""

    n_requests: int
    duration_s: float
    block_tokens: int
    apps: int
    mean_turns: float
    max_turns: int
    mean_input_tokens: float
    mean_output_tokens: float
    think_s: float
    think_spread: float | None
    spread: float
    app_prefix_tokens: tuple[int, int]
    follow_up_tokens: float | None
    paste_share: float
    short_answer_share: float
    answer_shape: float
    max_output_tokens: int | None
    lead_s: float | None
    max_input_tokens: int | None

    def __post_init__(self) -> None:
        if self.n_requests < 1 or self.duration_s <= 0 or self.block_tokens < 1 or self.apps < 1:
            raise ConfigError("n_requests, duration_s, block_tokens and apps must be positive")
        if not 1.0 <= self.mean_turns <= self.max_turns:
            raise ConfigError(
                f"mean_turns must be in [1, max_turns={self.max_turns}], got {self.mean_turns}"
            )
        if (
            self.mean_input_tokens < self.block_tokens
            or self.mean_output_tokens < 1
            or self.think_s < 0
            or self.spread < 0
        ):
            raise ConfigError("token means, think_s and spread out of range")
        low, high = self.app_prefix_tokens
        if not 0 <= low <= high:
            raise ConfigError(
                f"app_prefix_tokens must be an ordered range, got {self.app_prefix_tokens}"
            )
        if (self.think_spread is not None and self.think_spread < 0) or (
            self.follow_up_tokens is not None and self.follow_up_tokens < 1
        ):
            raise ConfigError("think_spread must be >= 0 and follow_up_tokens >= 1 (or None)")
        if not (0.0 <= self.paste_share <= 1.0 and 0.0 <= self.short_answer_share < 1.0):
            raise ConfigError("paste_share must be in [0, 1] and short_answer_share in [0, 1)")
        if self.answer_shape <= 0 or (
            self.max_output_tokens is not None and self.max_output_tokens < 1
        ):
            raise ConfigError("answer_shape must be > 0 and max_output_tokens >= 1 (or None)")
        if self.max_input_tokens is not None and self.max_input_tokens < self.block_tokens:
            raise ConfigError(
                f"max_input_tokens must be >= block_tokens, got {self.max_input_tokens}"
            )
        if self.lead_s is not None and self.lead_s < 0:
            raise ConfigError(f"lead_s must be >= 0 (or None), got {self.lead_s}")
        if self.short_answer_share * _SHORT_ANSWER_TOKENS >= self.mean_output_tokens:
            raise ConfigError("short answers alone exceed mean_output_tokens")


_SHORT_ANSWER_TOKENS = 32.0  # mean of a short answer (acknowledgements, one-liners)
_FOLLOW_UP_SPREAD = 1.0  # log standard deviation of a short follow-up message


def _messages(
    rng: random.Random,
    turns: int,
    spread: float,
    follow_up_tokens: float | None,
    paste_share: float,
) -> list[tuple[float, float]]:
    """One session's messages as ``(part scaled to the mean input, fixed tokens)``."""
    messages = []
    for turn in range(turns):
        if turn and follow_up_tokens is not None and rng.random() >= paste_share:
            messages.append((0.0, follow_up_tokens * rng.lognormvariate(0.0, _FOLLOW_UP_SPREAD)))
        else:
            messages.append((rng.lognormvariate(0.0, spread), 0.0))
    return messages


@dataclass(frozen=True)
class _AnswerLengths:
    """A mixture of short answers and gamma-distributed ones with the given mean."""

    mean: float
    short_share: float
    shape: float

    def draw(self, rng: random.Random, cap: int | None) -> float:
        if self.short_share and rng.random() < self.short_share:
            value = rng.expovariate(1.0 / _SHORT_ANSWER_TOKENS)
        else:
            mean = (self.mean - self.short_share * _SHORT_ANSWER_TOKENS) / (1.0 - self.short_share)
            if self.shape == 1.0:
                value = rng.expovariate(1.0 / mean)
            else:
                value = rng.gammavariate(self.shape, mean / self.shape)
        return value if cap is None else min(value, float(cap))


def _think_time(rng: random.Random, think_s: float, think_spread: float | None) -> float:
    if not think_s:
        return 0.0
    if think_spread is None:
        return rng.expovariate(1.0 / think_s)
    return think_s * rng.lognormvariate(0.0, think_spread)


def _sessions(rng: random.Random, n_requests: int, mean_turns: float, max_turns: int) -> list[int]:
    """Turn counts (geometric, mean about ``mean_turns``, capped) until they reach
    ``n_requests`` requests in all."""
    stop = 1.0 / mean_turns
    sessions: list[int] = []
    total = 0
    while total < n_requests:
        turns = 1
        while turns < max_turns and rng.random() >= stop:
            turns += 1
        sessions.append(turns)
        total += turns
    return sessions


def _message_scale(
    sessions: Sequence[int],
    shapes: Sequence[Sequence[tuple[float, float]]],
    outputs: Sequence[Sequence[float]],
    app_prefix: Sequence[int],
    mean_input: float,
) -> float:
    """The message-length scale that makes the mean prompt ``mean_input`` tokens: a
    turn's prompt is linear in it (the app prefix (its mean used), earlier answers and
    the fixed parts of messages are not scaled)."""
    fixed = scaled = 0.0
    count = 0
    prefix = sum(app_prefix) / len(app_prefix)
    for turns, shape, answers in zip(sessions, shapes, outputs, strict=True):
        messages = constant = answered = 0.0
        for turn in range(turns):
            messages += shape[turn][0]
            constant += shape[turn][1]
            answered += answers[turn - 1] if turn else 0.0
            fixed += prefix + answered + constant
            scaled += messages
            count += 1
    return max(1.0, (mean_input * count - fixed) / max(scaled, math.ulp(1.0)))


def _session_prompts(
    shape: Sequence[tuple[float, float]],
    answers: Sequence[float],
    prefix: float,
    scale: float,
    window: float,
) -> list[float]:
    """A session's prompt lengths (as :func:`conversation_trace` builds them, lengths
    not rounded), ending where the next turn would not fit ``window``."""
    prompts: list[float] = []
    prompt = prefix
    for turn, (scaled, fixed) in enumerate(shape):
        if turn:
            prompt += answers[turn - 1]
        prompt += max(1.0, scaled * scale + fixed)
        if prompt > window:
            if turn:
                break
            prompt = window
        prompts.append(prompt)
    return prompts


def _capped_message_scale(
    shapes: Sequence[Sequence[tuple[float, float]]],
    outputs: Sequence[Sequence[float]],
    app_prefix: Sequence[int],
    mean_input: float,
    window: float,
    uncapped: float,
) -> float:
    """The message-length scale that makes the mean prompt ``mean_input`` tokens when
    prompts are capped at ``window`` (the mean grows with the scale: bisection from the
    uncapped scale up; the largest scale tried where the mean cannot reach it)."""
    prefix = sum(app_prefix) / len(app_prefix)

    def mean_prompt(scale: float) -> float:
        prompts = [
            p
            for shape, answers in zip(shapes, outputs, strict=True)
            for p in _session_prompts(shape, answers, prefix, scale, window)
        ]
        return sum(prompts) / len(prompts)

    low, high = uncapped, uncapped
    while mean_prompt(high) < mean_input and high < 1024.0 * uncapped:
        low, high = high, 2.0 * high
    for _ in range(30):
        middle = (low + high) / 2.0
        low, high = (middle, high) if mean_prompt(middle) < mean_input else (low, middle)
    return high


class _HashIds:
    """Fresh block ids: every new block of every prompt gets its own."""

    def __init__(self) -> None:
        self._next = 0

    def fresh(self, count: int) -> list[int]:
        ids = list(range(self._next, self._next + max(0, count)))
        self._next += max(0, count)
        return ids
