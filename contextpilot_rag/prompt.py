"""The optimized prompt handed to an LLM client."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .blocks import ContextBlock

if TYPE_CHECKING:
    from .cloud.breakpoints import CachePlan
    from .cloud.segments import SplitSpec

__all__ = ["BlockBoundary", "Prompt", "PromptStats"]


class BlockBoundary(NamedTuple):
    """Where one block sits. ``char_start``/``char_end`` index into the content of
    ``messages[message_index]``; ``token_start``/``token_end`` count tokens from the
    start of the first message's content over all message contents in order (chat
    template tokens excluded), as measured by the pilot's tokenizer."""

    block_id: str
    message_index: int
    char_start: int
    char_end: int
    token_start: int
    token_end: int


@dataclass(frozen=True)
class PromptStats:
    """What the optimization did. ``reusable_tokens`` estimates the prompt tokens an
    engine can serve from its prefix cache (the matched prefix: system prompt,
    history and shared blocks); ``prompt_tokens`` estimates the whole prompt and
    ``tail_tokens`` its part after the last block (notes and question)."""

    blocks_total: int
    blocks_matched: int
    blocks_deduplicated: int
    reusable_tokens: int
    prompt_tokens: int
    tail_tokens: int


@dataclass(frozen=True)
class Prompt:
    """``messages`` is OpenAI chat format; ``blocks`` the blocks sent in full, in
    final order; ``deduplicated`` the blocks replaced by a location note;
    ``original_blocks`` the retriever's order. ``index`` is the position in the input
    of :meth:`ContextPilot.optimize_batch` (``None`` online). ``order_note`` restores
    the retriever's ranking (``None`` when notes are off, or when the blocks sent and
    then those the location note names already follow it);
    ``location_note`` names the de-duplicated blocks (``None`` when none).
    ``relabeled`` maps the blocks that the prompt shows under another label than
    their own :attr:`~contextpilot_rag.ContextBlock.label` (two blocks of the prompt,
    history included, would share one, or ``PilotConfig.label_style="id"`` shows the
    id) to that label; :attr:`labels` has every block's. ``history_lost`` is true when
    the conversation's store had dropped it (expired or evicted) and this turn
    starts it again without its history.

    ``tenant`` is the tenant the prompt was built for (``None``: none), and
    ``cache_salt`` the salt an engine with a salted prefix cache (vLLM's top-level
    ``cache_salt``) must get with it, so that no other tenant's request can reuse, or
    time, its cached prefix (``None``: send none; ``docs/tenants.md`` says when a tenant's
    prompt goes unsalted). :meth:`request_extras` has the fields to add to the
    request body.

    For hosted APIs (``docs/cloud.md``): :attr:`segments` has, per message, the
    offsets where its content blocks after the first start (:meth:`content_parts`),
    computed on first use from ``split_specs`` (``None``: one block);
    ``cache_plan`` says where cache breakpoints pay and why (``None``: not planned);
    ``prompt_cache_key`` is the OpenAI ``prompt_cache_key`` (a digest), and
    :attr:`prompt_cache_retention` the ``prompt_cache_retention`` the plan asks for.
    :meth:`to_anthropic` and :meth:`to_openai_request` shape the request."""

    messages: tuple[Mapping[str, str], ...]
    blocks: tuple[ContextBlock, ...]
    original_blocks: tuple[ContextBlock, ...]
    deduplicated: tuple[ContextBlock, ...]
    request_id: str
    boundaries: tuple[BlockBoundary, ...]
    stats: PromptStats
    conversation_id: str | None = None
    index: int | None = None
    order_note: str | None = None
    location_note: str | None = None
    relabeled: Mapping[str, str] = field(default_factory=dict)
    history_lost: bool = False
    tenant: str | None = None
    cache_salt: str | None = field(default=None, repr=False)
    split_specs: tuple[SplitSpec | None, ...] = field(default=(), repr=False, compare=False)
    cache_plan: CachePlan | None = field(default=None, repr=False)
    prompt_cache_key: str | None = None

    def request_extras(self) -> dict[str, str]:
        """Top-level fields to add to the OpenAI request body that sends this prompt:
        ``{"cache_salt": ...}`` for a salted prompt, else nothing. Send them only to
        engines that take ``cache_salt`` (vLLM); others may refuse unknown fields."""
        if self.cache_salt is None:
            return {}
        return {"cache_salt": self.cache_salt}

    @property
    def labels(self) -> dict[str, str]:
        """Block id → the label the prompt shows it under (unique in the prompt and
        its history), for every block of the request."""
        relabeled = self.relabeled
        return {block.id: relabeled.get(block.id, block.label) for block in self.original_blocks}

    def label_of(self, block_id: str) -> str:
        """The label the prompt shows block ``block_id`` under."""
        label = self.relabeled.get(block_id)
        if label is not None:
            return label
        for block in self.original_blocks:
            if block.id == block_id:
                return block.label
        raise KeyError(block_id)

    @property
    def matched_ids(self) -> frozenset[str]:
        """Ids of the blocks an earlier prompt already sent as this prompt's prefix:
        the first ``stats.blocks_matched`` of :attr:`blocks`, which an engine's prefix
        cache may serve."""
        return frozenset(block.id for block in self.blocks[: self.stats.blocks_matched])

    @property
    def deduplicated_ids(self) -> frozenset[str]:
        """Ids of the :attr:`deduplicated` blocks: an earlier turn of the conversation
        showed them, so the location note names them instead of sending them again."""
        return frozenset(block.id for block in self.deduplicated)

    @property
    def placed_blocks(self) -> tuple[ContextBlock, ...]:
        """Every distinct block of the request once: :attr:`blocks` in prompt order,
        then :attr:`deduplicated` (the order the integrations return results in)."""
        return (*self.blocks, *self.deduplicated)

    @property
    def notes(self) -> tuple[str, ...]:
        """The notes as rendered after the blocks, in order (order note, location note)."""
        return tuple(note for note in (self.order_note, self.location_note) if note is not None)

    def to_openai(self) -> list[dict[str, str]]:
        """Fresh, mutable copies of ``messages`` for an OpenAI-compatible client."""
        return [dict(message) for message in self.messages]

    @functools.cached_property
    def segments(self) -> tuple[tuple[int, ...], ...]:
        """Per message, the offsets where its content blocks after the first start."""
        from .cloud.segments import split_user_message

        return tuple(
            () if spec is None else split_user_message(message["content"], *spec)
            for message, spec in zip(self.messages, self.split_specs, strict=False)
        )

    def content_parts(self, message_index: int) -> tuple[str, ...]:
        """The content blocks message ``message_index`` is sent as to a provider with
        prompt caching: the context header with the first context block, each further
        block, then the notes and question (a history message splits the same way as
        when it was sent; other messages are one block)."""
        content = self.messages[message_index]["content"]
        cuts = self.segments[message_index] if message_index < len(self.segments) else ()
        bounds = (0, *cuts, len(content))
        return tuple(content[start:end] for start, end in itertools.pairwise(bounds) if start < end)

    def to_anthropic(self) -> dict[str, Any]:
        """Keyword arguments ``system`` and ``messages`` of Anthropic's
        ``client.messages.create`` (add ``model`` and ``max_tokens``), each context
        block its own text block, ``cache_control`` where :attr:`cache_plan` placed
        breakpoints."""
        from .cloud.requests import anthropic_kwargs

        return anthropic_kwargs(self)

    @property
    def prompt_cache_retention(self) -> str | None:
        """The OpenAI ``prompt_cache_retention`` the cache plan was made for (``"24h"``
        or ``"in_memory"``, chosen with ``CloudCacheConfig(ttl=...)``), or ``None``: no
        retention chosen, and the request should name none."""
        return None if self.cache_plan is None else self.cache_plan.retention

    def to_openai_request(
        self,
        *,
        cache_control: bool = False,
        cache_key: bool | None = None,
        cache_retention: bool | None = None,
        extra_body: bool = False,
    ) -> dict[str, Any]:
        """Keyword arguments for an OpenAI-compatible ``chat.completions.create``:
        ``messages``, ``prompt_cache_key`` and, when the plan asks for one,
        ``prompt_cache_retention`` (:attr:`prompt_cache_retention`).
        ``cache_control=True`` sends the messages as content parts with the breakpoints
        of :attr:`cache_plan` marked, for LiteLLM (which forwards them to Anthropic,
        Bedrock, Vertex). ``cache_key`` and ``cache_retention`` (default: ``not
        cache_control``, since those providers refuse them) say whether to add
        ``prompt_cache_key`` and ``prompt_cache_retention``; ``False`` for servers that
        refuse them. A plan made with OpenAI's breakpoint rules (``gpt-5.6`` and later,
        :data:`~contextpilot_rag.cloud.OPENAI_BREAKPOINT_RULES`) always sends content
        parts with ``prompt_cache_breakpoint`` on the planned blocks and
        ``prompt_cache_options={"mode": "explicit", ...}``. ``extra_body=True`` sends the
        cache fields (key, retention, options) in ``extra_body``, for clients that drop
        top-level fields they do not name (LiteLLM 1.84 drops them)."""
        from .cloud.requests import openai_kwargs

        return openai_kwargs(
            self,
            cache_control=cache_control,
            cache_key=cache_key,
            cache_retention=cache_retention,
            extra_body=extra_body,
        )

    def to_openai_responses(
        self, *, cache_key: bool = True, cache_retention: bool = True, extra_body: bool = False
    ) -> dict[str, Any]:
        """Keyword arguments for OpenAI's Responses API (``client.responses.create``):
        ``input`` (every message an input item), ``prompt_cache_key``, and the
        retention or, for a plan made with OpenAI's breakpoint rules (``gpt-5.6`` and
        later), the system and user messages as ``input_text`` parts with
        ``prompt_cache_breakpoint`` where the plan put them and ``prompt_cache_options``
        (:func:`~contextpilot_rag.cloud.requests.openai_responses_kwargs`)."""
        from .cloud.requests import openai_responses_kwargs

        return openai_responses_kwargs(
            self, cache_key=cache_key, cache_retention=cache_retention, extra_body=extra_body
        )

    @property
    def text(self) -> str:
        """The message contents joined by blank lines, for completion-style endpoints
        and base models without a chat template."""
        return "\n\n".join(message["content"] for message in self.messages)
