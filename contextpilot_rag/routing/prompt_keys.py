"""Route keys for real prompts: a :class:`~.types.RouteRequest` from a
:class:`~contextpilot_rag.prompt.Prompt`, OpenAI chat messages or a completion string.

The client does not hold the engine's tokens, so prefixes are identified by their
**text**, at the positions where the client knows a boundary exactly:

- a :class:`~contextpilot_rag.prompt.Prompt`: the end of every context block and of
  every message;
- raw chat messages: the end of every message (the chat template is not known, so the
  text is serialised as ``<|role|>\\n{content}\\n`` per message);
- when nothing but the end lies beyond the first block (one message, a completion
  string, a tiny system prompt): additionally a fixed leading prefix
  (``fixed_prefix_tokens``), the last resort that still lets prompts sharing a long
  preamble meet on one replica.

At each boundary the key is a CRC-32 chained over the UTF-8 text so far, combined with
the text's length (64 bits; two different prefixes of equal length collide with
probability 2⁻³², which costs at most one misrouted request: the engine's reported
cache hit corrects the route table). The boundary's block count is its character
position converted to tokens with a ``chars_per_token`` estimate (refined from the
engine's ``usage.prompt_tokens``), **aligned down** to the engine block; boundaries
inside the first block are dropped. Other blocks get per-request unique hashes, so
only boundaries can match. Block 0 always carries the key of the first block's text,
so hash fallbacks (Ranvier) agree across independent clients.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError, InvalidInputError
from ..prompt import Prompt
from .types import RouteRequest

__all__ = ["Messages", "PromptKeys", "PromptText", "serialise"]

Messages = Sequence[Mapping[str, str]]
PromptInput = Prompt | Messages | str

_MASK63 = (1 << 63) - 1
_unique = itertools.count(random.getrandbits(36))  # per-request bases for filler hashes


@dataclass(frozen=True)
class PromptText:
    """A prompt serialised for routing: its text and the character positions (exclusive
    ends, ascending) where the client knows a boundary."""

    text: str
    boundaries: tuple[int, ...]
    messages: tuple[dict[str, str], ...] = field(default=())


def _message(message: object, where: str) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise InvalidInputError(f"{where} must be a mapping with 'role' and 'content'")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not isinstance(content, str):
        raise InvalidInputError(f"{where} needs string 'role' and 'content' fields")
    return {"role": role, "content": content}


def serialise(payload: PromptInput) -> PromptText:
    """The routing text of ``payload`` and its known boundaries. Raises
    :class:`InvalidInputError` for anything but a Prompt, chat messages or a string."""
    if isinstance(payload, str):
        return PromptText(payload, (len(payload),))
    if isinstance(payload, Prompt):
        messages = tuple(dict(m) for m in payload.messages)
    elif isinstance(payload, Sequence) and payload:
        messages = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(payload))
    else:
        raise InvalidInputError(
            "expected a Prompt, a non-empty list of chat messages or a completion string, "
            f"got {type(payload).__name__}"
        )
    parts, starts, ends, position = [], [], [], 0
    for message in messages:
        header = f"<|{message['role']}|>\n"
        starts.append(position + len(header))
        part = f"{header}{message['content']}\n"
        parts.append(part)
        position += len(part)
        ends.append(position)
    boundaries = set(ends)
    if isinstance(payload, Prompt):
        boundaries.update(
            starts[b.message_index] + b.char_end
            for b in payload.boundaries
            if 0 <= b.message_index < len(starts)
        )
    return PromptText("".join(parts), tuple(sorted(boundaries)), messages)


class PromptKeys:
    """Builds :class:`RouteRequest` objects for real prompts (see the module docs).

    Not thread-safe on its own: the client serialises calls to :meth:`observe_tokens`."""

    def __init__(
        self,
        *,
        block_tokens: int = 16,
        chars_per_token: float = 4.0,
        fixed_prefix_tokens: int = 256,
        adapt: float = 0.1,
    ) -> None:
        if block_tokens < 1 or chars_per_token <= 0 or fixed_prefix_tokens < 1:
            raise ConfigError(
                "PromptKeys needs block_tokens >= 1, chars_per_token > 0, fixed_prefix_tokens >= 1"
            )
        if not 0 <= adapt <= 1:
            raise ConfigError(f"adapt must be in [0, 1], got {adapt}")
        self.block_tokens = block_tokens
        self.chars_per_token = chars_per_token
        self.fixed_prefix_tokens = fixed_prefix_tokens
        self.adapt = adapt

    def observe_tokens(self, characters: int, prompt_tokens: int) -> None:
        """Refine ``chars_per_token`` from an engine's count of a prompt's tokens."""
        if characters > 0 and prompt_tokens > 0:
            measured = characters / prompt_tokens
            self.chars_per_token += self.adapt * (measured - self.chars_per_token)

    def request(
        self,
        text: PromptText,
        *,
        request_id: str,
        expected_output_tokens: int = 128,
        session: str | None = None,
        features: Mapping[str, str | float] | None = None,
        logical_id: str | None = None,
        attempt: int = 0,
        excluded: frozenset[tuple[str, str]] = frozenset(),
        arrival_s: float = 0.0,
    ) -> RouteRequest:
        """The :class:`RouteRequest` of a serialised prompt."""
        body, cpt, block = text.text, self.chars_per_token, self.block_tokens
        prompt_tokens = max(1, round(len(body) / cpt))
        blocks = prompt_tokens // block
        positions = list(text.boundaries)
        if not any(block * cpt <= p < len(body) for p in positions):
            positions.append(min(len(body), int(self.fixed_prefix_tokens * cpt)))  # last resort
        base = next(_unique) << 24
        hashes = list(range(base, base + blocks))
        keyed: dict[int, int] = {}
        crc, done = 0, 0
        for position in sorted(set(positions)):
            b = min(blocks, int(position / cpt) // block)
            if b < 1 or b in keyed:
                continue  # inside the first block, or a block already keyed (keep the first)
            crc = zlib.crc32(body[done:position].encode(), crc)
            done = position
            keyed[b] = ((position << 32) | crc) & _MASK63
        if blocks:
            first = min(len(body), int(block * cpt))
            hashes[0] = ((first << 32) | zlib.crc32(body[:first].encode())) & _MASK63
        for b, key in keyed.items():
            hashes[b - 1] = key
        return RouteRequest(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            block_hashes=tuple(hashes),
            block_tokens=block,
            expected_output_tokens=expected_output_tokens,
            boundaries=tuple(sorted(keyed)),
            session=session,
            arrival_s=arrival_s,
            features=dict(features or {}),
            logical_id=logical_id,
            attempt=attempt,
            excluded=excluded,
        )
