"""The cloud-cache cost benchmark on a provider's real API (``bench --suite cloud --live``).

The emulated suite (:mod:`.cloud_suite`) says what the providers' *published* cache
rules predict. This module measures it: it sends the same requests — unmodified with
the two common caching practices, and the pilot's — to the provider through its
official SDK (``anthropic`` or ``openai``) with the user's key, each at its workload's
send time, reads the cache usage every response reports
(:func:`~contextpilot_rag.usage.parse_input_tokens`) and bills it at the same list
prices (:func:`~contextpilot_rag.cloud.input_cost`). Beside every measured figure it
gives the emulator's prediction for the very same request bodies sent at the same
times, so a reader sees both the saving and how far the published rules are from the
provider's behaviour.

How a run stays a fair comparison:

* Every arm's system prompt starts with a line naming the run (a random id) and the
  arm, so no arm reads another arm's cache entries, and no run reads an earlier run's.
* Prompts are built exactly as in the emulated suite, on the workload's own clock,
  each turn's answer the workload's synthetic one (a reply from the model would change
  the next turn's prompt from arm to arm); ``max_tokens`` (1 on Anthropic, 16 and the
  least reasoning effort on OpenAI by default) keeps the output small, since only input
  tokens are compared.
* Requests go out at ``at_s × time_scale`` seconds after the start, from a pool of
  ``workers`` threads. ``time_scale`` 1 keeps the workload's timing, which is what
  decides what a 5-minute cache still holds; a smaller one shortens the run but lets
  less expire than the workload would (the prediction is computed at the same scaled
  times, so the two stay comparable). How late the latest request left is reported.

It costs money: before anything is sent, the largest cost the run could have (every
prompt token billed at the highest input-side price, with a margin for the provider's
own tokenizer, plus ``max_tokens`` of output per request) must fit ``max_usd``, or a
:class:`~contextpilot_rag.errors.ConfigError` says how much it could cost. A run that
spends more than ``max_usd`` anyway stops with a
:class:`~contextpilot_rag.errors.ProviderError`, as does any request the API fails.
The API key is read by the SDK from its environment variable (``ANTHROPIC_API_KEY``,
``OPENAI_API_KEY``) unless given; it is never printed or stored: an API error that
quotes it is reported with ``***`` in its place, and a ``base_url`` with credentials
in it (``https://user:pass@gateway/v1``) is refused, since the SDKs' HTTP client logs
every request's URL and the report names the URL.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..cloud import DEFAULT_PRICES, ModelPrice, input_cost
from ..errors import ConfigError, ContextPilotError, ProviderError
from ..experiment import baseline_config
from ..prompt import Prompt
from ..routing.client.endpoints import display_url
from ..tokenizers import Tokenizer, default_tokenizer
from ..usage import InputTokens, parse_input_tokens
from .cloud_suite import (
    DEFAULT_MODELS,
    PROVIDERS,
    CloudRun,
    Shape,
    _AnthropicArm,
    _arm,
    _arm_shapes,
    _OpenAIArm,
    _pilot_config,
    _practices,
    _prompts,
    _Tally,
    _TokenCache,
)
from .cloud_workloads import CloudWorkload, TimedRequest
from .sections import markdown_table, pyplot, save_figure

__all__ = [
    "API_KEY_VARIABLES",
    "OPENAI_MAX_TOKENS",
    "SMALLEST_SCALE",
    "TOKEN_MARGIN",
    "LiveOptions",
    "LiveRun",
    "LiveRunStopped",
    "LiveSuiteResult",
    "live_markdown",
    "live_plot",
    "live_tables",
    "reasoning_effort",
    "run_live_suite",
    "write_live_json",
]

API_KEY_VARIABLES: Mapping[str, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
}
"""The environment variable each SDK reads its key from."""

OPENAI_MAX_TOKENS = 16
"""OpenAI's default output cap: its GPT-5 models answer a request whose
``max_completion_tokens`` leaves room for no visible token with HTTP 400, so a run
asks for a few tokens, and for the least reasoning the model takes
(:func:`reasoning_effort`)."""

TOKEN_MARGIN = 1.3
"""The budget check counts prompts with the offline tokenizer; the provider's own
tokenizer may count more tokens for the same text, by this factor at most (assumed)."""


@dataclass(frozen=True)
class LiveOptions:
    """How a live run reaches the provider and what it may spend.

    ``model``: the provider model (``None``: :data:`~.cloud_suite.DEFAULT_MODELS`);
    it needs a row in :data:`~contextpilot_rag.cloud.DEFAULT_PRICES`. ``base_url``:
    the API's base URL (``None``: the SDK's default, the provider's own API; a
    compatible server or :class:`~contextpilot_rag.testing.cloud_server.CloudCacheServer`
    otherwise). ``api_key``: ``None`` reads :data:`API_KEY_VARIABLES`. ``max_usd``:
    the most the whole run may cost (input and output). ``time_scale``: send times
    relative to the workload's (1: as generated). ``workers``: requests in flight at
    most. ``max_tokens``: output tokens asked per request (``None``:
    :attr:`chosen_max_tokens`). ``timeout_s``: per request.
    ``retries``: how often a request the API refused without processing it (a rate
    limit's 429, an overload's 529, no connection) is sent again, after the API's
    ``retry-after`` or a backoff, before the run stops; a timeout or another error is
    not retried (it may have been billed: it counts at its most against ``max_usd``).
    A retried request is late, which the report shows.
    """

    provider: str
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_usd: float = 1.0
    time_scale: float = 1.0
    workers: int = 8
    max_tokens: int | None = None
    timeout_s: float = 120.0
    retries: int = 5

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ConfigError(
                f"provider must be one of {', '.join(PROVIDERS)}, got {self.provider!r}"
            )
        for name in ("model", "base_url", "api_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty str or None")
        if self.base_url is not None:
            _check_url(self.base_url, "base_url")
        for name in ("max_usd", "time_scale", "timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        if self.time_scale > 1:
            raise ConfigError(f"time_scale must be at most 1, got {self.time_scale!r}")
        for name, least in (("workers", 1), ("max_tokens", 1), ("retries", 0)):
            value = getattr(self, name)
            if name == "max_tokens" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
        if not math.isfinite(self.max_usd):
            raise ConfigError(f"max_usd must be a finite number of USD, got {self.max_usd!r}")
        try:
            DEFAULT_PRICES.price(self.chosen_model)
        except ContextPilotError as error:
            raise ConfigError(f"model {self.chosen_model!r} has no list price: {error}") from None

    @property
    def chosen_model(self) -> str:
        return self.model or DEFAULT_MODELS[self.provider]

    @property
    def chosen_max_tokens(self) -> int:
        """``max_tokens``, else 1 on Anthropic and :data:`OPENAI_MAX_TOKENS` on OpenAI
        (whose reasoning models refuse a cap that fits no visible token)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return 1 if self.provider == "anthropic" else OPENAI_MAX_TOKENS

    @property
    def price(self) -> ModelPrice:
        return DEFAULT_PRICES.price(self.chosen_model)


@dataclass(frozen=True)
class LiveRun:
    """One workload on the provider's API: ``measured``, the arms as the responses'
    usage billed them; ``predicted``, the emulator's figures for the same request
    bodies at the same times. ``late_s``: how long after its scheduled time the
    latest request left."""

    measured: CloudRun
    predicted: CloudRun
    late_s: float


@dataclass(frozen=True)
class LiveSuiteResult:
    runs: tuple[LiveRun, ...]
    provider: str
    model: str
    run_id: str
    base_url: str | None
    time_scale: float
    scale: float
    spent_usd: float  # input and output, as the responses reported them
    elapsed_s: float
    price: ModelPrice
    stopped: str | None = None  # why a run stopped early: then only the requests every
    # arm had answered are compared (measured and predicted alike); None: complete


class LiveRunStopped(ProviderError):
    """A live run stopped early (a failed request, the budget, Ctrl-C). ``partial``:
    what it measured before, over the requests every arm had answered (``None`` when
    there were none), so the money spent still yields its comparison."""

    def __init__(self, message: str, partial: LiveSuiteResult | None) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass
class _Job:
    """One request of one arm: what is sent, when, and what came back."""

    due_s: float
    order: tuple[int, int, int]  # workload, request, arm: the send order at equal times
    body: dict[str, Any]
    breakpoints: int  # its cache_control markers (Anthropic)
    sender: tuple[int, int, str] = (0, 0, "")  # workload, arm, user: whose turns in order
    prompt_tokens: int = 0  # as the emulator counted them
    predicted: InputTokens | None = None  # the emulator's usage for it
    usage: InputTokens | None = None
    late_s: float = 0.0
    after: threading.Event | None = None  # the sender's previous request answered
    done: threading.Event = field(default_factory=threading.Event)


class _Arm:
    """An arm of one workload: its name, its jobs and the emulator that predicts them."""

    def __init__(self, name: str, predictor: _AnthropicArm | _OpenAIArm, price: ModelPrice) -> None:
        self.name, self.predictor = name, predictor
        self.jobs: list[_Job] = []
        self.measured = _Tally(name, price)


def _salted(shape: Shape, line: str, provider: str) -> Shape:
    """``shape`` with ``line`` put before the system prompt's text (a system prompt of
    that line alone where the request has none)."""

    def salted(prompt: Prompt, timed: TimedRequest) -> dict[str, Any]:
        body: dict[str, Any] = copy.deepcopy(shape(prompt, timed))
        if provider == "anthropic":  # system: a list of text blocks
            body["system"] = body.get("system") or [{"type": "text", "text": ""}]
            body["system"][0]["text"] = line + body["system"][0]["text"]
            return body
        messages = body["messages"]
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
        content = messages[0]["content"]
        if isinstance(content, str):
            messages[0]["content"] = line + content
        else:  # content parts
            content[0]["text"] = line + content[0]["text"]
        return body

    return salted


def _plan(
    workloads: Sequence[CloudWorkload],
    options: LiveOptions,
    run_id: str,
    tokenizer: Tokenizer,
    tokens: _TokenCache,
) -> list[list[_Arm]]:
    """Every workload's arms with their jobs, each job's usage predicted."""
    provider, model, price = options.provider, options.chosen_model, options.price
    # as in the emulated suite: the unmodified prompts split into content blocks the
    # way Anthropic's planning splits them, for both providers
    plain = baseline_config(_pilot_config("anthropic", DEFAULT_MODELS["anthropic"]))
    planned: list[list[_Arm]] = []
    for w, workload in enumerate(workloads):
        unmodified = list(_prompts(workload, plain, tokenizer))
        ours = list(_prompts(workload, _pilot_config(provider, model), tokenizer))
        arms: list[_Arm] = []
        for a, (name, shape, pilot) in enumerate(_arm_shapes(provider, model=model)):
            line = f"[run {run_id}, {workload.family} seed {workload.seed}, arm {a + 1}]\n"
            salted = _salted(shape, line, provider)
            arm = _Arm(name, _arm(provider, name, salted, model, tokens), price)
            for r, (prompt, timed) in enumerate(ours if pilot else unmodified):
                tokens.learn(prompt)
                scaled = replace(timed, at_s=timed.at_s * options.time_scale)
                body = salted(prompt, scaled)
                replayed = arm.predictor.send_body(body, scaled)
                usage = replayed.usage
                sender = (w, a, timed.user)
                job = _Job(
                    scaled.at_s,
                    (w, r, a),
                    body,
                    replayed.breakpoints,
                    sender,
                    usage.prompt_tokens,
                    usage,
                )
                arm.jobs.append(job)
            arms.append(arm)
        planned.append(arms)
    return planned


def _worst_cost_usd(planned: Sequence[Sequence[_Arm]], options: LiveOptions) -> float:
    every = [arm for arms in planned for arm in arms]
    prompt_tokens = sum(arm.predictor.tally.result().prompt_tokens for arm in every)
    requests = sum(len(arm.jobs) for arm in every)
    return _worst_usd(prompt_tokens, requests, options)


def _worst_job_usd(job: _Job, options: LiveOptions) -> float:
    """The most one request can cost (as :func:`_worst_cost_usd` counts it)."""
    return _worst_usd(job.prompt_tokens, 1, options)


def _worst_usd(prompt_tokens: int, requests: int, options: LiveOptions) -> float:
    """The most ``requests`` requests of ``prompt_tokens`` in all can cost: every prompt
    token at the highest input-side price (the arms mark 5-minute entries), with
    :data:`TOKEN_MARGIN`, plus the output cap of each request."""
    price = options.price
    highest = max(price.input, price.cache_write_5m or 0.0)
    output = price.output if price.output is not None else 5 * price.input
    cap = options.chosen_max_tokens
    return (prompt_tokens * TOKEN_MARGIN * highest + requests * cap * output) / 1e6


_NOT_PROCESSED = frozenset({429, 529})  # rate limited, overloaded: refused before any work


def _retry_after_s(error: BaseException, attempt: int) -> float | None:
    """How long to wait before sending a failed request again, or ``None`` when it must
    not be sent again: only a request the API refused unprocessed (429, 529, no
    connection) is retried, after the API's ``retry-after`` or an exponential backoff.
    A timeout or another error may come after the API processed (and billed) it."""
    if type(error).__name__ == "APITimeoutError":
        return None
    status = getattr(error, "status_code", None)
    if status not in _NOT_PROCESSED and type(error).__name__ != "APIConnectionError":
        return None
    response = getattr(error, "response", None)
    header = None if response is None else response.headers.get("retry-after")
    try:
        asked = float(header) if header is not None else None
    except ValueError:
        asked = None
    backoff = min(30.0, 0.5 * 2**attempt)
    return backoff if asked is None or not math.isfinite(asked) else min(60.0, max(0.0, asked))


def _may_have_billed(error: BaseException) -> bool:
    """Whether a failed request may have been processed and billed all the same."""
    if type(error).__name__ == "APITimeoutError":
        return True
    status = getattr(error, "status_code", None)
    return isinstance(status, int) and status >= 500 and status not in _NOT_PROCESSED


SMALLEST_SCALE = 1e-4
"""The budget refusal's search goes no lower: every family is at its least size here."""

_BISECTIONS = 10  # halvings of the scale's logarithm between SMALLEST_SCALE and the run's


def _scale_that_fits(
    workloads_at: Callable[[float], Sequence[CloudWorkload]],
    scale: float,
    options: LiveOptions,
    run_id: str,
    tokenizer: Tokenizer,
) -> tuple[float | None, float]:
    """The largest scale below ``scale`` found whose worst case fits ``max_usd`` (two
    significant digits, rounded down; ``None``: not even the smallest fits), and the
    smallest workloads' worst case. A geometric bisection: the cost grows with the
    scale, though not in proportion (each family has a least size); only a scale
    whose worst case was computed is named."""

    def worst_at(candidate: float) -> float:
        planned = _plan(workloads_at(candidate), options, run_id, tokenizer, _TokenCache(tokenizer))
        return _worst_cost_usd(planned, options)

    def fits(candidate: float) -> bool:
        return worst_at(candidate) <= options.max_usd

    least = worst_at(SMALLEST_SCALE)
    if least > options.max_usd:
        return None, least
    low, high = SMALLEST_SCALE, scale
    for _ in range(_BISECTIONS):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if fits(middle) else (low, middle)
    step = 10.0 ** (math.floor(math.log10(low)) - 1)
    rounded = round(math.floor(low / step) * step, 12)
    if SMALLEST_SCALE <= rounded < low and fits(rounded):
        return rounded, least
    return low, least


_SDK_DEFAULT_URLS = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com/v1",
}


def _check_url(url: str, name: str) -> None:
    """Refuse a URL that carries credentials (``user:pass@``, or a query string, where
    gateways take keys): the SDKs' HTTP client logs every request's URL, and the report
    names it."""
    shown = display_url(url)
    if shown != url or "?" in url:
        raise ConfigError(
            f"{name} {shown.partition('?')[0]!r} carries credentials or a query: give the "
            "key as api_key (or its environment variable), not in the URL"
        )


def _used_url(options: LiveOptions, client: Any) -> str | None:
    """The base URL the SDK client sends to (also one it took from ``ANTHROPIC_BASE_URL``
    / ``OPENAI_BASE_URL``), checked as a given one is; ``None`` for the provider's own."""
    used = str(client.base_url).rstrip("/")
    _check_url(used, "the SDK's base URL (from --base-url or its environment variable)")
    return None if used == _SDK_DEFAULT_URLS[options.provider] else used


def _api_key(options: LiveOptions) -> str:
    """The key the run sends: ``options.api_key``, else its environment variable."""
    variable = API_KEY_VARIABLES[options.provider]
    key = options.api_key or os.environ.get(variable)
    if not key:
        raise ConfigError(f"no API key: set {variable} (or pass api_key)")
    return key


def _client(options: LiveOptions, key: str) -> Any:
    """The provider's SDK client (imported here: the ``cloud`` extra)."""
    try:
        if options.provider == "anthropic":
            import anthropic

            return anthropic.Anthropic(
                api_key=key,
                base_url=options.base_url,
                timeout=options.timeout_s,
                max_retries=0,  # retried here: see _retry_after_s
            )
        import openai

        return openai.OpenAI(
            api_key=key,
            base_url=options.base_url,
            timeout=options.timeout_s,
            max_retries=0,
        )
    except ImportError as error:
        raise ConfigError(
            f"the {options.provider} SDK is not installed: pip install 'contextpilot-rag[cloud]'"
        ) from error


def reasoning_effort(model: str) -> str | None:
    """The least ``reasoning_effort`` an OpenAI model takes (only input tokens are
    compared): ``"none"`` on GPT-5.1 and later, ``"minimal"`` on GPT-5, ``"low"`` on the
    o-series; ``None`` (not sent) for models without reasoning."""
    name = model.lower()
    if re.match(r"gpt-5\.\d", name):
        return "none"
    if re.match(r"gpt-5(-|$)", name):
        return "minimal"
    if re.match(r"o\d", name):
        return "low"
    return None


def _sender(options: LiveOptions, client: Any) -> Callable[[dict[str, Any]], Any]:
    model, max_tokens = options.chosen_model, options.chosen_max_tokens
    if options.provider == "anthropic":

        def send_anthropic(body: dict[str, Any]) -> Any:
            return client.messages.create(model=model, max_tokens=max_tokens, **body)

        return send_anthropic

    effort = reasoning_effort(model)
    reasoning = {} if effort is None else {"reasoning_effort": effort}

    def send_openai(body: dict[str, Any]) -> Any:
        extra = {key: value for key, value in body.items() if key != "messages"}
        return client.chat.completions.create(
            model=model,
            messages=body["messages"],
            max_completion_tokens=max_tokens,
            extra_body=extra or None,
            **reasoning,
        )

    return send_openai


class _Dispatch:
    """Sends jobs at their times from a thread pool; stops at the first failure or
    when the spend passes the budget."""

    def __init__(self, options: LiveOptions, send: Callable[[dict[str, Any]], Any]) -> None:
        self._options, self._send = options, send
        self._lock = threading.Lock()
        self.spent_usd = 0.0
        self.failure: BaseException | None = None
        self.failed_job: _Job | None = None

    def run(self, jobs: Sequence[_Job], tick: Callable[[], None]) -> None:
        started = time.monotonic()
        # a conversation's next turn leaves only once its previous one is answered (the
        # provider serves a cache entry only after the response that wrote it): with a
        # time_scale below 1 its due time may come first, and the wait shows as late
        previous: dict[tuple[int, int, str], threading.Event] = {}
        for job in jobs:
            job.after = previous.get(job.sender)
            previous[job.sender] = job.done
        with ThreadPoolExecutor(self._options.workers, thread_name_prefix="cloud-live") as pool:
            futures: list[Future[None]] = []
            try:
                for job in jobs:
                    wait_s = started + job.due_s - time.monotonic()
                    if wait_s > 0:
                        time.sleep(wait_s)
                    if self.failure is not None:
                        break
                    futures.append(pool.submit(self._one, job, started, tick))
                for future in futures:
                    future.result()
            except KeyboardInterrupt:  # the requests in flight finish, the others are dropped
                with self._lock:
                    self.failure, self.failed_job = ProviderError("interrupted"), None

    def _one(self, job: _Job, started: float, tick: Callable[[], None]) -> None:
        try:
            self._answer(job, started, tick)
        finally:
            job.done.set()

    def _send_retrying(self, job: _Job) -> Any:
        """Send ``job``, again after a refusal that processed nothing (``retries`` times
        at most); any other failure is raised at once (a retry could bill it twice)."""
        attempt = 0
        while True:
            try:
                return self._send(job.body)
            except Exception as error:
                wait_s = _retry_after_s(error, attempt)
                if wait_s is None or attempt >= self._options.retries or self.failure is not None:
                    raise
            attempt += 1
            time.sleep(wait_s)

    def _answer(self, job: _Job, started: float, tick: Callable[[], None]) -> None:
        if job.after is not None:
            job.after.wait()  # submitted earlier, so already taken by a worker
        if self.failure is not None:
            return
        job.late_s = max(0.0, time.monotonic() - started - job.due_s)
        try:
            response = self._send_retrying(job)
            usage = parse_input_tokens(response)
        except Exception as error:  # the SDK's errors, reported with the job below
            with self._lock:
                if _may_have_billed(error):  # counted at the most it can have cost
                    self.spent_usd += _worst_job_usd(job, self._options)
                if self.failure is None:
                    self.failure, self.failed_job = error, job
            return
        job.usage = usage
        price = self._options.price
        output = (usage.output_tokens or 0) * (price.output or 0.0) / 1e6
        with self._lock:
            self.spent_usd += input_cost(usage, price).total + output
            if self.spent_usd > self._options.max_usd and self.failure is None:
                self.failure = ProviderError(
                    f"the spend passed max_usd {self._options.max_usd:g}; it stopped sending"
                )
                self.failed_job = job
        tick()


def run_live_suite(
    workloads: Sequence[CloudWorkload],
    options: LiveOptions,
    *,
    tokenizer: Tokenizer | None = None,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
    scale: float = 1.0,
    workloads_at: Callable[[float], Sequence[CloudWorkload]] | None = None,
) -> LiveSuiteResult:
    """Send every arm of ``workloads`` to ``options.provider`` (module docstring).
    ``scale``: the workloads' size relative to the documented run, for the report.
    ``workloads_at``: the same workloads at another scale; given, a run over the
    budget is refused with the largest scale found whose worst case fits (or, when even
    the smallest workloads do not, the budget they need), rather than a proportional
    guess that a workload's least size can defeat.
    Raises :class:`ConfigError` (bad options, no key, no SDK, a run that could cost
    more than ``max_usd``) before anything is sent, :class:`ProviderError` when a
    request fails or the spend passes ``max_usd``."""
    if not workloads:
        raise ConfigError("no workloads to run")
    tokenizer = tokenizer or default_tokenizer()
    tokens = _TokenCache(tokenizer)
    run_id = secrets.token_hex(4)
    planned = _plan(workloads, options, run_id, tokenizer, tokens)
    worst = _worst_cost_usd(planned, options)
    if worst > options.max_usd:
        over = (
            f"this run could cost up to {worst:.2f} USD at {options.chosen_model}'s list "
            f"price, over max_usd {options.max_usd:g}: raise max_usd (--max-usd)"
        )
        if workloads_at is None:
            guess = scale * options.max_usd / worst
            raise ConfigError(f"{over} or lower the workload scale (--scale) to about {guess:.2g}")
        fits, smallest = _scale_that_fits(workloads_at, scale, options, run_id, tokenizer)
        if fits is None:
            raise ConfigError(
                f"{over}; even the smallest workloads could cost up to {smallest:.2f} USD, "
                f"so max_usd must be at least that"
            )
        raise ConfigError(f"{over} or lower the workload scale (--scale) to {fits:g}")
    key = _api_key(options)
    client = _client(options, key)
    used_url = _used_url(options, client)
    send = _sender(options, client)
    jobs = sorted(
        (job for arms in planned for arm in arms for job in arm.jobs),
        key=lambda job: (job.due_s, job.order),
    )
    tick = progress(f"{options.provider}: live requests", len(jobs)) if progress else _no_tick
    dispatch = _Dispatch(options, send)
    started = time.perf_counter()
    dispatch.run(jobs, tick)

    def result(runs: Sequence[LiveRun], stopped: str | None) -> LiveSuiteResult:
        return LiveSuiteResult(
            tuple(runs),
            options.provider,
            options.chosen_model,
            run_id,
            used_url,
            options.time_scale,
            scale,
            dispatch.spent_usd,
            time.perf_counter() - started,
            options.price,
            stopped,
        )

    if dispatch.failure is not None:
        spent = f"{dispatch.spent_usd:.4f} USD spent before the run stopped"
        if isinstance(dispatch.failure, ProviderError):
            message = f"{dispatch.failure} ({spent})"
        else:
            where = _describe(dispatch.failed_job, workloads, planned)
            # an API (or a gateway) that quotes the request's key in its error must not
            # put the key in this message: it reaches the terminal and the logs
            # (nor as the chained cause, whose text a traceback prints)
            said = str(dispatch.failure).replace(key, "***")
            message = f"{where}: {said} ({spent})"
        answered = [
            run
            for workload, arms in zip(workloads, planned, strict=True)
            if (run := _live_run(workload, arms, options, answered_only=True)) is not None
        ]
        partial = result(answered, message) if answered else None
        raise LiveRunStopped(message, partial) from None
    return result(
        [
            run
            for workload, arms in zip(workloads, planned, strict=True)
            if (run := _live_run(workload, arms, options)) is not None
        ],
        None,
    )


def _no_tick() -> None:
    return None


def _describe(
    job: _Job | None, workloads: Sequence[CloudWorkload], planned: Sequence[Sequence[_Arm]]
) -> str:
    if job is None:
        return "a request"
    w, r, a = job.order
    workload = workloads[w]
    return f"{workload.family} seed {workload.seed}, {planned[w][a].name}, request {r + 1}"


def _live_run(
    workload: CloudWorkload,
    arms: Sequence[_Arm],
    options: LiveOptions,
    *,
    answered_only: bool = False,
) -> LiveRun | None:
    """The measured and predicted arms of one workload; ``answered_only`` (a run that
    stopped): over the requests every arm had answered, ``None`` when there are none."""
    price = options.price
    if answered_only:
        kept = set.intersection(*({job.order[1] for job in arm.jobs if job.usage} for arm in arms))
        if not kept:
            return None
        predicted = [_Tally(arm.name, price) for arm in arms]
        for arm, tally in zip(arms, predicted, strict=True):
            for job in arm.jobs:
                if job.order[1] in kept and job.predicted is not None:
                    tally.add(job.predicted, job.breakpoints)
    else:
        kept = {job.order[1] for arm in arms for job in arm.jobs}
        predicted = [arm.predictor.tally for arm in arms]
    for arm in arms:
        for job in arm.jobs:
            if job.order[1] in kept:
                assert job.usage is not None  # answered in every arm
                arm.measured.add(job.usage, job.breakpoints)
    names = _practices(options.provider, options.chosen_model)

    def run_of(tallies: Sequence[_Tally]) -> CloudRun:
        return CloudRun(
            workload.family,
            workload.seed,
            options.provider,
            options.chosen_model,
            workload.description,
            tuple(tally.result() for tally in tallies),
            names,
        )

    return LiveRun(
        run_of([arm.measured for arm in arms]),
        run_of(predicted),
        max((job.late_s for arm in arms for job in arm.jobs if job.usage), default=0.0),
    )


# -- presenting ----------------------------------------------------------------------


def _rows(result: LiveSuiteResult) -> list[list[str]]:
    rows = []
    for run in result.runs:
        label = f"{run.measured.family} seed {run.measured.seed}"
        for measured, predicted in zip(run.measured.arms, run.predicted.arms, strict=True):
            rows.append(
                [
                    label,
                    measured.name,
                    f"{measured.cost_usd:.4f}",
                    f"{predicted.cost_usd:.4f}",
                    f"{measured.cache_read_tokens:,} / {measured.cache_write_tokens:,} / "
                    f"{measured.uncached_tokens:,}",
                    f"{predicted.cache_read_tokens:,} / {predicted.cache_write_tokens:,} / "
                    f"{predicted.uncached_tokens:,}",
                ]
            )
    return rows


_HEADER = [
    "workload",
    "arm",
    "measured $",
    "predicted $",
    "measured read / written / uncached",
    "predicted read / written / uncached",
]


def _summary(result: LiveSuiteResult) -> list[list[str]]:
    return [
        [
            f"{run.measured.family} seed {run.measured.seed}",
            run.measured.baseline.name,
            f"{run.measured.ratio:.2f}x",
            f"{run.predicted.ratio:.2f}x",
            f"{run.late_s:.1f} s",
        ]
        for run in result.runs
    ]


_SUMMARY_HEADER = [
    "workload",
    "baseline (the cheaper practice, measured)",
    "baseline / ours, measured",
    "baseline / ours, predicted",
    "latest request late by",
]


def _facts(result: LiveSuiteResult) -> str:
    where = result.base_url or f"{result.provider}'s API"
    stopped = ""
    if result.stopped is not None:
        stopped = (
            f"**Incomplete**: the run stopped ({result.stopped}); only the requests every "
            "arm had answered are compared. "
        )
    return stopped + (
        f"Measured on {where} with {result.model} (run {result.run_id}; workloads at scale "
        f"{result.scale:g}, send times × {result.time_scale:g}); priced at the list prices "
        f"read on {result.price.read_on} ({result.price.source}); spent {result.spent_usd:.4f} "
        f"USD in {result.elapsed_s:.0f} s. *Predicted*: the emulator "
        "(`contextpilot_rag.sim.provider_cache`) on the same request bodies at the same times."
    )


def live_tables(result: LiveSuiteResult) -> list[Any]:
    """Rich tables: the ratio per workload, then every arm, measured and predicted."""
    from rich.table import Table

    summary = Table(title=f"input-token cost on {result.provider} (measured)")
    for name in _SUMMARY_HEADER:
        summary.add_column(name)
    for row in _summary(result):
        summary.add_row(*row)
    detail = Table(title="every arm: measured and predicted")
    for name in _HEADER:
        detail.add_column(name)
    for row in _rows(result):
        detail.add_row(*row)
    return [summary, detail]


def live_markdown(result: LiveSuiteResult) -> str:
    """The run as markdown: its facts, the ratios, every arm."""
    lines = ["## Hosted prompt caches, measured on the provider's API", "", _facts(result), ""]
    lines += [*markdown_table(_SUMMARY_HEADER, _summary(result)), ""]
    lines += markdown_table(_HEADER, _rows(result))
    return "\n".join(lines)


def write_live_json(result: LiveSuiteResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=2) + "\n", encoding="utf-8")


def live_plot(result: LiveSuiteResult, path: Path) -> bool:
    """Bars of every arm's cost, measured beside predicted, per workload; False
    without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    figure, axes = plt.subplots(figsize=(max(6.0, 2.6 * len(result.runs)), 4.0))
    names = [arm.name for arm in result.runs[0].measured.arms]
    width = 0.8 / (2 * len(names))
    for n, name in enumerate(names):
        for k, (kind, alpha) in enumerate((("measured", 1.0), ("predicted", 0.45))):
            values = [getattr(run, kind).arm(name).cost_usd for run in result.runs]
            offsets = [i + (2 * n + k - len(names)) * width for i in range(len(result.runs))]
            axes.bar(offsets, values, width, alpha=alpha, color=f"C{n}", label=f"{name}, {kind}")
    axes.set_xticks(range(len(result.runs)))
    axes.set_xticklabels([f"{r.measured.family}\nseed {r.measured.seed}" for r in result.runs])
    axes.set_ylabel("input cost, USD")
    axes.set_title(f"{result.provider} ({result.model}): measured and predicted")
    axes.legend(fontsize=7)
    save_figure(figure, path)
    return True
