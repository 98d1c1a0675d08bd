"""A :class:`~contextpilot_rag.Prompt` in a hosted provider's request shape.

- :func:`anthropic_kwargs`: the ``system`` and ``messages`` keyword arguments of
  ``anthropic.Anthropic().messages.create``: every message a list of text content
  blocks (:meth:`Prompt.content_parts`: each context block its own), with
  ``cache_control`` on the blocks where the prompt's :class:`~.breakpoints.CachePlan`
  put a breakpoint;
- :func:`openai_kwargs`: ``messages`` (and ``prompt_cache_key``, and the
  ``prompt_cache_retention`` the plan was made for) for an OpenAI-compatible client;
  with ``cache_control=True`` the messages carry the same content parts and markers,
  which LiteLLM forwards to Anthropic, Bedrock and Vertex. A prompt planned with
  :data:`~.rules.OPENAI_BREAKPOINT_RULES` (``gpt-5.6`` and later) carries OpenAI's own
  markers, ``prompt_cache_breakpoint``, and ``prompt_cache_options``.

:func:`cache_prefix_bytes` serializes a request's text as the provider's cache sees
it (every content block with its role, in order; the markers excluded, as they are
not part of the cached content), with the offset at which each marked block ends: a
request reuses an earlier one's cache entry only if that entry's bytes are a prefix
of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from ..errors import ConfigError, InvalidInputError
from .rules import MARKERS

if TYPE_CHECKING:
    from ..prompt import Prompt
    from .breakpoints import CachePlan

__all__ = [
    "anthropic_kwargs",
    "cache_control_of",
    "cache_prefix_bytes",
    "openai_kwargs",
    "openai_responses_kwargs",
]


def cache_control_of(ttl: str) -> dict[str, str]:
    """The ``cache_control`` value of a breakpoint with lifetime ``ttl``."""
    if ttl == "5m":
        return {"type": "ephemeral"}
    if ttl == "1h":
        return {"type": "ephemeral", "ttl": "1h"}
    raise InvalidInputError(f"cache lifetime must be '5m' or '1h', got {ttl!r}")


_EXPLICIT = {"mode": "explicit"}
"""The ``prompt_cache_breakpoint`` value of an OpenAI breakpoint."""


def _openai_breakpoints(plan: CachePlan | None) -> TypeGuard[CachePlan]:
    """Whether ``plan`` was made with OpenAI's breakpoint rules (``gpt-5.6`` and later)."""
    return plan is not None and plan.marker == "prompt_cache_breakpoint"


def _marker_of(plan: CachePlan | None) -> tuple[str, dict[str, str]]:
    """The field that marks a breakpoint under ``plan`` and its value."""
    if _openai_breakpoints(plan):
        return "prompt_cache_breakpoint", dict(_EXPLICIT)
    # the lifetime's marker only where there is one to place: OpenAI's lifetimes have none
    ttl = plan.ttl if plan is not None and plan.breakpoints else "5m"
    return "cache_control", cache_control_of(ttl)


def _marked_parts(prompt: Prompt) -> dict[int, set[int]]:
    """Message index → the indexes of its content parts that carry a breakpoint."""
    marked: dict[int, set[int]] = {}
    plan = prompt.cache_plan
    if plan is None:
        return marked
    for message_index, part in plan.positions:
        count = max(1, len(prompt.content_parts(message_index)))  # "" is one blank part
        index = part if part >= 0 else count + part
        if 0 <= index < count:
            marked.setdefault(message_index, set()).add(index)
    return marked


def _content_messages(prompt: Prompt) -> list[tuple[str, list[Any]]]:
    """Every message as (role, text content blocks), the plan's marker
    (:attr:`~.breakpoints.CachePlan.marker`) on the marked ones. Blank parts (an empty
    or whitespace-only answer, system prompt or note) are left out, since the Messages
    API refuses a whitespace-only text block and a message without content; a marker
    on one, or on a block of a role that may carry none (OpenAI's assistant messages),
    moves to the last block kept before it that may (the same bytes end there or
    before), and a message left without blocks is left out (the API joins the
    consecutive same-role turns around it)."""
    plan = prompt.cache_plan
    marked = _marked_parts(prompt)
    field, value = _marker_of(plan)
    unmarked = plan.unmarked_roles if plan is not None else ()
    out: list[tuple[str, list[Any]]] = []
    last_markable: dict[str, Any] | None = None
    for index, message in enumerate(prompt.messages):
        blocks: list[Any] = []
        markable = message["role"] not in unmarked
        for number, text in enumerate(prompt.content_parts(index) or ("",)):
            if text.strip():
                blocks.append({"type": "text", "text": text})
                if markable:
                    last_markable = blocks[-1]
            if number in marked.get(index, ()) and last_markable is not None:
                last_markable[field] = dict(value)
        if blocks:
            out.append((message["role"], blocks))
    return out


def anthropic_kwargs(prompt: Prompt) -> dict[str, Any]:
    """``system`` (when the prompt has one) and ``messages`` for Anthropic's Messages
    API; the caller adds ``model`` and ``max_tokens``. A prompt from a pilot without
    ``CloudCacheConfig(enabled=True)`` has no plan: one text block per message, no
    ``cache_control``."""
    plan = prompt.cache_plan
    if plan is not None and plan.marker != "cache_control":
        raise ConfigError(
            f"this prompt's breakpoints were planned for {plan.marker} ({plan.provider}'s "
            "rules); plan with ANTHROPIC_RULES for Anthropic's API"
        )
    system: list[Any] = []
    messages: list[dict[str, Any]] = []
    for role, blocks in _content_messages(prompt):
        if role == "system":
            system.extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    kwargs: dict[str, Any] = {"messages": messages}
    if system:
        kwargs["system"] = system
    return kwargs


def openai_kwargs(
    prompt: Prompt,
    *,
    cache_control: bool = False,
    cache_key: bool | None = None,
    cache_retention: bool | None = None,
    extra_body: bool = False,
) -> dict[str, Any]:
    """``messages`` for an OpenAI-compatible client, plus ``prompt_cache_key`` (when
    ``cache_key`` and the prompt has one) and ``prompt_cache_retention`` (when
    ``cache_retention`` and the prompt's plan asks for a retention:
    ``CloudCacheConfig(ttl="24h")`` or ``"in_memory"`` on OpenAI's rules; never for
    ``"5m"``, whose requests get the organization's default). ``cache_control``: every
    message as content parts with the prompt's breakpoints marked (for LiteLLM and
    other gateways that forward them; blank parts and messages left out as for
    Anthropic); otherwise plain string contents. ``cache_key`` and ``cache_retention``
    default to ``not cache_control``: the gateways that take the markers forward to
    providers that refuse both fields. Without a plan (``CloudCacheConfig(enabled=False)``,
    the default) there are no markers, no key and no retention.

    A prompt planned with OpenAI's breakpoint rules
    (:data:`~.rules.OPENAI_BREAKPOINT_RULES`, ``gpt-5.6`` and later) is always sent as
    content parts with ``prompt_cache_breakpoint: {"mode": "explicit"}`` on the planned
    blocks (a breakpoint the plan put at the end of an assistant message moves to the
    last block before it, as OpenAI takes none there) and
    ``prompt_cache_options={"mode": "explicit", "ttl": ...}``, so that OpenAI adds no
    breakpoint of its own at the latest message (a write of the whole prompt at 1.25×
    that the planner found would not pay); ``cache_control=True`` is refused for it.

    ``extra_body=True`` puts the cache fields (key, retention, options) in
    ``extra_body`` (which the OpenAI SDK merges into the request body) for clients that
    drop top-level fields they do not name: LiteLLM 1.84 drops them."""
    if cache_retention is not None and not isinstance(cache_retention, bool):
        raise ConfigError(
            f"cache_retention must be True, False or None, got {cache_retention!r}; the "
            "retention is chosen with the lifetime planned with: CloudCacheConfig(ttl=...)"
        )
    for name, flag in (("cache_key", cache_key), ("cache_control", cache_control)):
        if flag is not None and not isinstance(flag, bool):
            raise ConfigError(f"{name} must be True, False or None, got {flag!r}")
    plan = prompt.cache_plan
    breakpoints = _openai_breakpoints(plan)
    if cache_control and breakpoints:
        raise ConfigError(
            "cache_control=True asks for Anthropic's markers, but this prompt's breakpoints "
            "were planned for OpenAI's prompt_cache_breakpoint (its rules); plan with "
            "ANTHROPIC_RULES for a gateway that forwards cache_control"
        )
    if cache_control or breakpoints:
        parts = _content_messages(prompt)
        messages = [{"role": role, "content": blocks} for role, blocks in parts]
    else:
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt.messages]
    if cache_key is None:
        cache_key = not cache_control
    if cache_retention is None:
        cache_retention = not cache_control
    return _with_cache_fields(
        {"messages": messages}, prompt, cache_key, cache_retention, extra_body
    )


def openai_responses_kwargs(
    prompt: Prompt,
    *,
    cache_key: bool = True,
    cache_retention: bool = True,
    extra_body: bool = False,
) -> dict[str, Any]:
    """``input`` for OpenAI's Responses API (``client.responses.create``), plus the
    same cache fields as :func:`openai_kwargs`: every message an input item (the system
    prompt a ``system`` one, in order); a plan made with OpenAI's breakpoint rules sends
    the system and user messages as ``input_text`` parts with ``prompt_cache_breakpoint``
    where it put them (an answer's moves to the question before it) and
    ``prompt_cache_options``; otherwise each message's content is its text. An
    assistant message's content is always its text (OpenAI takes no breakpoint there)."""
    for name, flag in (("cache_key", cache_key), ("cache_retention", cache_retention)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{name} must be True or False, got {flag!r}")
    plan = prompt.cache_plan
    if _openai_breakpoints(plan):
        items = [
            {"role": role, "content": _responses_content(role, blocks)}
            for role, blocks in _content_messages(prompt)
        ]
    else:
        items = [{"role": m["role"], "content": m["content"]} for m in prompt.messages]
    return _with_cache_fields({"input": items}, prompt, cache_key, cache_retention, extra_body)


def _responses_content(role: str, blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's text blocks as Responses content: ``input_text`` parts (their
    markers kept), or an assistant message's text."""
    if role == "assistant":
        return "".join(block["text"] for block in blocks)
    return [{**block, "type": "input_text"} for block in blocks]


def _with_cache_fields(
    kwargs: dict[str, Any],
    prompt: Prompt,
    cache_key: bool,
    cache_retention: bool,
    extra_body: bool,
) -> dict[str, Any]:
    """``kwargs`` with the prompt's cache fields: its key and retention where asked for
    and present, the options of a plan made for OpenAI's breakpoints; in ``extra_body``
    when asked."""
    if not isinstance(extra_body, bool):
        raise ConfigError(f"extra_body must be True or False, got {extra_body!r}")
    if cache_key and prompt.prompt_cache_key is not None:
        kwargs["prompt_cache_key"] = prompt.prompt_cache_key
    if cache_retention and prompt.prompt_cache_retention is not None:
        kwargs["prompt_cache_retention"] = prompt.prompt_cache_retention
    plan = prompt.cache_plan
    if _openai_breakpoints(plan):
        # explicit: no implicit breakpoint at the latest message, whose write the
        # planner did not choose (it would write the whole prompt at the write price)
        kwargs["prompt_cache_options"] = {"mode": "explicit", "ttl": plan.ttl}
    if extra_body:
        fields = {name: kwargs.pop(name) for name in _CACHE_FIELDS if name in kwargs}
        if fields:
            kwargs["extra_body"] = fields
    return kwargs


_CACHE_FIELDS = ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options")


def cache_prefix_bytes(request: Mapping[str, Any]) -> tuple[bytes, tuple[int, ...]]:
    """The cached text of an Anthropic-shaped (``system`` + ``messages``) or
    OpenAI-shaped request (``messages``, or the Responses API's ``input``), and the byte
    offset where each block marked with ``cache_control`` or ``prompt_cache_breakpoint``
    ends, in order."""
    if not isinstance(request, Mapping):
        raise InvalidInputError(f"a request's keyword arguments, got {type(request).__name__}")
    out = bytearray()
    ends: list[int] = []
    for role, block in _content_blocks(request):
        text = block.get("text") if isinstance(block, Mapping) else block
        if not isinstance(text, str):
            raise InvalidInputError(f"content block without text: {block!r}")
        out += json.dumps([role, text], ensure_ascii=False).encode("utf-8", "surrogatepass")
        out += b"\n"
        if isinstance(block, Mapping) and any(block.get(m) is not None for m in MARKERS):
            ends.append(len(out))
    return bytes(out), tuple(ends)


def _content_blocks(request: Mapping[str, Any]) -> list[tuple[str, Any]]:
    blocks: list[tuple[str, Any]] = []
    system = request.get("system")
    if system is not None:
        blocks += [("system", block) for block in _as_list(system)]
    given = request.get("input") or ()
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    messages = request.get("messages") or ()
    if not isinstance(items, (list, tuple)) or not isinstance(messages, (list, tuple)):
        raise InvalidInputError("a request's 'messages' and 'input' must be lists of messages")
    for message in (*messages, *items):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidInputError(f"not a message with a role: {message!r}")
        content = message.get("content")
        if content is None:  # an assistant's tool call: no text to cache
            continue
        blocks += [(message["role"], block) for block in _as_list(content)]
    return blocks


def _as_list(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, (list, tuple)):
        return list(content)
    raise InvalidInputError(f"message content must be a str or a list of blocks: {content!r}")
