"""The engine's cache truth, read from whatever usage report the answer came with.

Every engine and framework reports how much of a prompt it served from its prefix
cache, each in its own words. :func:`parse_cache_usage` reads the common shapes,
duck-typed (a mapping or an object with attributes), into one :class:`CacheUsage`:

- OpenAI Chat Completions ``usage`` (OpenAI, vLLM with
  ``--enable-prompt-tokens-details``, SGLang): ``prompt_tokens`` and
  ``prompt_tokens_details.cached_tokens``;
- OpenAI Responses ``usage``: ``input_tokens`` and ``input_tokens_details.cached_tokens``;
- llama-server ``timings``: ``cache_n`` cached plus ``prompt_n`` computed;
- LangChain ``usage_metadata``: ``input_tokens`` and ``input_token_details.cache_read``;
- Anthropic ``usage``: ``input_tokens`` (uncached) + ``cache_read_input_tokens`` +
  ``cache_creation_input_tokens``;
- Gemini ``usage_metadata``: ``prompt_token_count`` and ``cached_content_token_count``
  (or their REST spellings ``promptTokenCount`` / ``cachedContentTokenCount``); Gemini
  omits the cached count when it is zero, so its absence there reads as 0.

- the flat ``cached_tokens`` / ``prompt_tokens`` pair the routing adapters report
  (``ChatContextPilot``'s ``response_metadata``, ``ContextPilotLLM``'s
  ``additional_kwargs``).

What carries a report is read through it, a few levels deep (:data:`CARRIERS`): a whole
response or final stream chunk (``usage``, ``timings``, ``usage_metadata``), the OpenAI
SDK's ``ChatCompletion`` / ``CompletionUsage``, a LangChain ``AIMessage``,
``ChatGeneration`` or single-prompt ``LLMResult`` (``message``, ``response_metadata`` /
``llm_output`` → ``token_usage``, ``generations``), a LlamaIndex ``ChatResponse`` or
``CompletionResponse`` (``raw``, ``additional_kwargs``). A report that says nothing about
the cache is an error, never "0 cached": the caller would evict what the engine may well
hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from .errors import InvalidInputError

__all__ = ["CARRIERS", "CacheUsage", "InputTokens", "parse_cache_usage", "parse_input_tokens"]

CARRIERS = (
    "usage",
    "timings",
    "usage_metadata",
    "usageMetadata",
    "token_usage",
    "response_metadata",
    "llm_output",
    "message",
    "generations",
    "raw",
    "additional_kwargs",
)
"""The fields a report is looked for in, breadth first, up to :data:`_MAX_DEPTH` levels
below what :func:`parse_cache_usage` is given."""

_MAX_DEPTH = 3  # LLMResult → generation → message → usage_metadata

_LOOKED_FOR = (
    "prompt_tokens_details.cached_tokens (OpenAI), timings.cache_n (llama-server), "
    "input_token_details.cache_read (LangChain), cache_read_input_tokens (Anthropic), "
    "cached_content_token_count (Gemini)"
)


@dataclass(frozen=True)
class CacheUsage:
    """``cached_tokens`` of the engine's ``prompt_tokens`` were served from its prefix
    cache. Guaranteed: both are ints and ``0 <= cached_tokens <= prompt_tokens``."""

    cached_tokens: int
    prompt_tokens: int

    def __post_init__(self) -> None:
        for name in ("cached_tokens", "prompt_tokens"):
            _check_count(name, getattr(self, name))
        if self.cached_tokens > self.prompt_tokens:
            raise InvalidInputError(
                f"usage reports {self.cached_tokens} cached tokens of only "
                f"{self.prompt_tokens} prompt tokens"
            )


def parse_cache_usage(report: object) -> CacheUsage:
    """Read the cached and total prompt tokens from ``report``: a usage record, or a
    response, message or chunk carrying one. Raises :class:`InvalidInputError` when it
    holds no cache information, or counts that are not non-negative integers. The first
    report found, breadth first through :data:`CARRIERS`, is the answer."""
    for node in _carried(report):
        for reader in _READERS:
            usage = reader(node)
            if usage is not None:
                return usage
    raise InvalidInputError(
        f"no prompt-cache information in the usage report ({type(report).__name__}); "
        f"looked for {_LOOKED_FOR}. Ask the engine for it (vLLM: "
        "--enable-prompt-tokens-details) or call observe_cache() with the counts"
    )


def _carried(report: object) -> Iterator[object]:
    """``report``, then what it carries, level by level (each object once)."""
    level, seen = [report], set()
    for depth in range(_MAX_DEPTH + 1):
        following: list[object] = []
        for node in level:
            if node is None or isinstance(node, (str, bytes)) or id(node) in seen:
                continue
            seen.add(id(node))
            yield node
            if depth < _MAX_DEPTH:
                following.extend(_carriers_of(node))
        level = following


def _carriers_of(node: object) -> Iterator[object]:
    for name in CARRIERS:
        value = _field(node, name)
        if name == "generations":
            value = _only_generation(value)
        if value is not None:
            yield value


def _only_generation(generations: object) -> object:
    """The generation of an ``LLMResult`` that answered one prompt with one
    generation (``[[generation]]``); ``None`` for any other shape, whose usage would
    be ambiguous."""
    if isinstance(generations, list) and len(generations) == 1:
        (inner,) = generations
        if isinstance(inner, list) and len(inner) == 1:
            return inner[0]
    return None


def _field(node: object, name: str) -> object:
    """``node[name]`` or ``node.name``; ``None`` when absent (SDK models use ``None``)."""
    if isinstance(node, Mapping):
        return node.get(name)
    return getattr(node, name, None)


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"usage field {name} must be a non-negative int, got {value!r}")
    return value


def _required(node: object, name: str, cache_field: str) -> int:
    value = _field(node, name)
    if value is None:
        raise InvalidInputError(f"usage reports {cache_field} but not {name}")
    return _check_count(name, value)


def _cached_of_total(node: object, cache_path: str, total_field: str) -> CacheUsage | None:
    """The shape "a cached count (at dotted ``cache_path``) of a total prompt count";
    ``None`` when the cached count is absent."""
    cached = node
    for name in cache_path.split("."):
        cached = _field(cached, name)
    if cached is None:
        return None
    return CacheUsage(_check_count(cache_path, cached), _required(node, total_field, cache_path))


def _openai(node: object) -> CacheUsage | None:
    return _cached_of_total(node, "prompt_tokens_details.cached_tokens", "prompt_tokens")


def _openai_responses(node: object) -> CacheUsage | None:
    return _cached_of_total(node, "input_tokens_details.cached_tokens", "input_tokens")


def _llama_server(node: object) -> CacheUsage | None:
    cache_n = _field(node, "cache_n")
    if cache_n is None:
        return None
    cached = _check_count("cache_n", cache_n)
    return CacheUsage(cached, cached + _required(node, "prompt_n", "cache_n"))


def _langchain(node: object) -> CacheUsage | None:
    return _cached_of_total(node, "input_token_details.cache_read", "input_tokens")


def _anthropic(node: object) -> CacheUsage | None:
    """Anthropic reports either cache field as ``None`` or leaves it out when caching
    was not asked for; one of them present is enough (the other then counts 0)."""
    details = _anthropic_input(node)
    if details is None:
        return None
    return CacheUsage(details.cache_read_tokens, details.prompt_tokens)


def _gemini(node: object) -> CacheUsage | None:
    """Gemini leaves the cached count out when nothing was served from cache (its
    usage metadata omits zero fields), so with the prompt count present it means 0."""
    for cache_field, total_field in (
        ("cached_content_token_count", "prompt_token_count"),
        ("cachedContentTokenCount", "promptTokenCount"),
    ):
        usage = _cached_of_total(node, cache_field, total_field)
        if usage is not None:
            return usage
        total = _field(node, total_field)
        if total is not None:
            return CacheUsage(0, _check_count(total_field, total))
    return None


def _flat(node: object) -> CacheUsage | None:
    """``cached_tokens`` beside ``prompt_tokens``: the routing adapters' facts (and a
    :class:`CacheUsage` itself)."""
    return _cached_of_total(node, "cached_tokens", "prompt_tokens")


_READERS: tuple[Callable[[object], CacheUsage | None], ...] = (
    _openai,
    _openai_responses,
    _llama_server,
    _langchain,
    _anthropic,
    _gemini,
    _flat,
)


@dataclass(frozen=True)
class InputTokens:
    """A request's input tokens as the provider bills them: ``uncached_tokens`` at the
    base input price, ``cache_read_tokens`` read from the cache, and cache writes with
    a 5-minute and a 1-hour lifetime; ``output_tokens`` when reported (``None``: not).
    Guaranteed: all counts are non-negative ints."""

    uncached_tokens: int
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "uncached_tokens",
            "cache_read_tokens",
            "cache_write_5m_tokens",
            "cache_write_1h_tokens",
        ):
            _check_count(name, getattr(self, name))
        if self.output_tokens is not None:
            _check_count("output_tokens", self.output_tokens)

    @property
    def cache_write_tokens(self) -> int:
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def prompt_tokens(self) -> int:
        """Every input token of the request, cached or not."""
        return self.uncached_tokens + self.cache_read_tokens + self.cache_write_tokens


def parse_input_tokens(report: object) -> InputTokens:
    """Read the billed split of a request's input from ``report`` (any shape
    :func:`parse_cache_usage` reads, found the same way): Anthropic's
    ``input_tokens`` / ``cache_read_input_tokens`` / ``cache_creation_input_tokens``
    (and ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``),
    LangChain's ``input_token_details.cache_read`` / ``cache_creation``, OpenAI's
    ``cache_write_tokens`` (``prompt_tokens_details`` in Chat Completions,
    ``input_tokens_details`` in Responses; ``gpt-5.6`` and later) as 5-minute-priced
    writes, LiteLLM's ``cache_creation_input_tokens`` beside OpenAI's fields; elsewhere
    every cached token is a read and nothing a write. Raises :class:`InvalidInputError`
    as :func:`parse_cache_usage` does, and for OpenAI writes that with the cached tokens
    exceed the prompt."""
    for node in _carried(report):
        for reader in _INPUT_READERS:
            details = reader(node)
            if details is not None:
                return details
    usage = parse_cache_usage(report)
    return InputTokens(usage.prompt_tokens - usage.cached_tokens, usage.cached_tokens)


def _count_or_zero(node: object, name: str) -> int:
    value = _field(node, name)
    return 0 if value is None else _check_count(name, value)


def _output(node: object, *names: str) -> int | None:
    for name in names:
        value = _field(node, name)
        if value is not None:
            return _check_count(name, value)
    return None


def _write_split(node: object, written: int, details_field: str) -> tuple[int, int]:
    """(5-minute, 1-hour) cache writes: from the breakdown under ``details_field``
    when present, else all ``written`` as 5-minute writes."""
    breakdown = _field(node, details_field)
    if breakdown is None:
        return written, 0
    hour = _count_or_zero(breakdown, "ephemeral_1h_input_tokens")
    five = _field(breakdown, "ephemeral_5m_input_tokens")
    return (written - hour if five is None else _check_count("ephemeral_5m", five)), hour


def _anthropic_input(node: object) -> InputTokens | None:
    read = _field(node, "cache_read_input_tokens")
    created = _field(node, "cache_creation_input_tokens")
    if (read is None and created is None) or _field(node, "prompt_tokens") is not None:
        return None
    cache_field = "cache_read_input_tokens" if read is not None else "cache_creation_input_tokens"
    uncached = _required(node, "input_tokens", cache_field)
    written = _count_or_zero(node, "cache_creation_input_tokens")
    five, hour = _write_split(node, written, "cache_creation")
    return InputTokens(
        uncached,
        _count_or_zero(node, "cache_read_input_tokens"),
        max(0, five),
        hour,
        _output(node, "output_tokens"),
    )


_LANGCHAIN_CACHE_FIELDS = (
    "cache_read",
    "cache_creation",
    "ephemeral_5m_input_tokens",
    "ephemeral_1h_input_tokens",
)


def _langchain_input(node: object) -> InputTokens | None:
    details = _field(node, "input_token_details")
    if details is None or _field(node, "input_tokens") is None:
        return None
    if all(_field(details, name) is None for name in _LANGCHAIN_CACHE_FIELDS):
        return None  # {} (an engine that reports no cache counts): no cache information
    total = _check_count("input_tokens", _field(node, "input_tokens"))
    read = _count_or_zero(details, "cache_read")
    hour = _count_or_zero(details, "ephemeral_1h_input_tokens")
    # langchain-anthropic zeroes cache_creation when it reports the 5m / 1h split
    split = _count_or_zero(details, "ephemeral_5m_input_tokens") + hour
    written = max(_count_or_zero(details, "cache_creation"), split)
    if read + written > total:
        raise InvalidInputError(f"usage reports {read + written} cached of {total} input tokens")
    return InputTokens(
        total - read - written,
        read,
        written - min(hour, written),
        min(hour, written),
        _output(node, "output_tokens"),
    )


def _openai_input(node: object) -> InputTokens | None:
    """OpenAI's fields, with the cache writes of ``gpt-5.6`` and later
    (``prompt_tokens_details.cache_write_tokens``); LiteLLM adds Anthropic's
    ``cache_creation_input_tokens``, counted in its ``prompt_tokens`` (newer releases
    mirror it in ``cache_write_tokens``), and their 5-minute / 1-hour split under
    ``prompt_tokens_details.cache_creation_token_details``."""
    usage = _openai(node)
    if usage is None:
        return None
    details = _field(node, "prompt_tokens_details")
    litellm_written = _field(node, "cache_creation_input_tokens")
    if litellm_written is None:
        written = _fitting_writes(details, usage)
    else:  # as LiteLLM has always been read: cut to what is not a read
        room = usage.prompt_tokens - usage.cached_tokens
        written = min(_check_count("cache_creation_input_tokens", litellm_written), room)
    _, hour = _write_split(details, written, "cache_creation_token_details")
    hour = min(hour, written)
    uncached = usage.prompt_tokens - usage.cached_tokens - written
    return InputTokens(
        uncached, usage.cached_tokens, written - hour, hour, _output(node, "completion_tokens")
    )


def _openai_responses_input(node: object) -> InputTokens | None:
    """The Responses API's ``input_tokens`` with ``input_tokens_details.cached_tokens``
    and ``cache_write_tokens``."""
    usage = _openai_responses(node)
    if usage is None:
        return None
    written = _fitting_writes(_field(node, "input_tokens_details"), usage)
    uncached = usage.prompt_tokens - usage.cached_tokens - written
    return InputTokens(uncached, usage.cached_tokens, written, 0, _output(node, "output_tokens"))


def _fitting_writes(details: object, usage: CacheUsage) -> int:
    """OpenAI's ``cache_write_tokens`` under ``details`` (0 when absent), which with the
    cached tokens must fit in the prompt."""
    written = _count_or_zero(details, "cache_write_tokens")
    if usage.cached_tokens + written > usage.prompt_tokens:
        raise InvalidInputError(
            f"usage reports {usage.cached_tokens} cached_tokens and {written} "
            f"cache_write_tokens of only {usage.prompt_tokens} prompt tokens"
        )
    return written


def _gemini_input(node: object) -> InputTokens | None:
    usage = _gemini(node)
    if usage is None:
        return None
    output = _output(node, "candidates_token_count", "candidatesTokenCount")
    return InputTokens(usage.prompt_tokens - usage.cached_tokens, usage.cached_tokens, 0, 0, output)


_INPUT_READERS: tuple[Callable[[object], InputTokens | None], ...] = (
    _openai_input,
    _openai_responses_input,
    _langchain_input,
    _anthropic_input,
    _gemini_input,
)
