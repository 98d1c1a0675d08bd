"""Route keys for real prompts: a :class:`~.types.RouteRequest` from a
:class:`~contextpilot_rag.prompt.Prompt`, OpenAI chat messages or a completion string.

The client does not hold the engine's tokens, so prefixes are identified by their
**text**, at the positions where the client knows a boundary exactly:

- a :class:`~contextpilot_rag.prompt.Prompt`: the end of every context block and of
  every message;
- raw chat messages: the end of every message. With a known chat template
  (:data:`CHAT_TEMPLATES`: ``chatml``, ``llama3``, ``gemma``) the messages are rendered
  as the engine renders them, so the text and its length in tokens match what the engine
  prefills; otherwise they are serialised as ``<|role|>\\n{content}\\n`` per message;
- a completion string with a known template (a prompt the caller rendered): a **marker
  scan** finds the end of every turn (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``);
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
that align to block 0 or 1 are dropped. Other blocks get per-request unique hashes,
so only boundaries can match. Block 0 always carries the key of the first block's
text, measured with the *configured* ``chars_per_token`` (not the refined estimate),
so it never changes while a client learns and hash fallbacks (Ranvier) agree across
independent clients.

**Salts.** A prompt sent with a ``cache_salt`` lives in its own namespace of the
engine's prefix cache (vLLM mixes the salt into the first block's hash, so no block is
shared with another salt or with none); its route keys are in the same namespace:
every block hash is XOR-ed with :func:`route_salt` of the salt, so a prompt never
matches a route learned from a prompt of another salt (another tenant's) or of none,
and unsalted prompts (public ones, ``docs/tenants.md``) share routes as they share the
engine's cache.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, InvalidInputError
from ..prompt import Prompt
from .types import RouteRequest

__all__ = [
    "CHAT_TEMPLATES",
    "ChatTemplate",
    "Messages",
    "PromptKeys",
    "PromptText",
    "route_salt",
    "serialise",
]

Messages = Sequence[Mapping[str, Any]]
PromptInput = Prompt | Messages | str

_MASK63 = (1 << 63) - 1
_unique = itertools.count(random.getrandbits(36))  # per-request bases for filler hashes


@dataclass(frozen=True)
class PromptText:
    """A prompt serialised for routing: its text and the character positions (exclusive
    ends, ascending) where the client knows a boundary; ``messages``: the chat messages
    to send, as given."""

    text: str
    boundaries: tuple[int, ...]
    messages: tuple[dict[str, Any], ...] = field(default=())


@dataclass(frozen=True)
class ChatTemplate:
    """How an engine's chat template renders messages, enough to find turn ends.

    ``turn`` is formatted with ``role`` and ``content``; ``end`` closes every turn (the
    marker the scan looks for); ``roles`` renames roles (Gemma's ``model``);
    ``system_into_user`` prepends a leading system message to the first user turn
    (Gemma has no system turn)."""

    name: str
    turn: str
    end: str
    bos: str = ""
    roles: Mapping[str, str] = field(default_factory=dict)
    system_into_user: bool = False

    def render(self, messages: Sequence[Mapping[str, str]]) -> tuple[str, list[int], list[int]]:
        """The rendered text, each message's content start and each turn's end."""
        turns = [dict(m) for m in messages]
        prepend = ""
        if self.system_into_user and len(turns) > 1 and turns[0]["role"] == "system":
            prepend = turns.pop(0)["content"] + "\n\n"
        text, starts, ends = [self.bos], [], []
        position = len(self.bos)
        for i, message in enumerate(turns):
            role = self.roles.get(message["role"], message["role"])
            head, _, tail = self.turn.partition("{content}")
            head = head.format(role=role) + (prepend if i == 0 else "")
            starts.append(position + len(head))
            part = head + message["content"] + tail.format(role=role) + self.end
            text.append(part)
            position += len(part)
            ends.append(position)
        if prepend:  # the system message shares the first user turn
            starts.insert(0, starts[0] - len(prepend))
            ends.insert(0, starts[1])
        return "".join(text), starts, ends

    def scan(self, text: str) -> list[int]:
        """The marker scan: the position after every turn end in a rendered ``text``."""
        ends, at = [], text.find(self.end)
        while at >= 0:
            ends.append(at + len(self.end))
            at = text.find(self.end, at + len(self.end))
        return ends


_PLAIN = ChatTemplate("plain", "<|{role}|>\n{content}", "\n")
_TEXT = ChatTemplate("text", "{content}", "\n\n")  # Prompt.text
CHAT_TEMPLATES: Mapping[str, ChatTemplate] = {
    "chatml": ChatTemplate("chatml", "<|im_start|>{role}\n{content}", "<|im_end|>\n"),
    "llama3": ChatTemplate(
        "llama3",
        "<|start_header_id|>{role}<|end_header_id|>\n\n{content}",
        "<|eot_id|>",
        bos="<|begin_of_text|>",
    ),
    "gemma": ChatTemplate(
        "gemma",
        "<start_of_turn>{role}\n{content}",
        "<end_of_turn>\n",
        bos="<bos>",
        roles={"assistant": "model"},
        system_into_user=True,
    ),
}
"""Chat templates the client can render and scan (Qwen / many others use ChatML)."""


def chat_template(name: str | ChatTemplate | None) -> ChatTemplate | None:
    """A template by name (or as given); :class:`ConfigError` for an unknown name."""
    if name is None or isinstance(name, ChatTemplate):
        return name
    if name not in CHAT_TEMPLATES:
        raise ConfigError(f"unknown chat template {name!r}; choose one of {list(CHAT_TEMPLATES)}")
    return CHAT_TEMPLATES[name]


def _message(message: object, where: str) -> dict[str, Any]:
    """A copy of an OpenAI chat message, checked: a string ``role``; ``content`` a
    string, a list of content parts (objects with a ``type``), or ``None`` next to
    ``tool_calls``. Every other field (``tool_calls``, ``tool_call_id``, ``name``) is
    kept and sent as given."""
    if not isinstance(message, Mapping):
        raise InvalidInputError(f"{where} must be a mapping with 'role' and 'content'")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str):
        raise InvalidInputError(f"{where} needs a string 'role'")
    if content is None:
        if not message.get("tool_calls"):
            raise InvalidInputError(f"{where} needs 'content' (None only with 'tool_calls')")
    elif isinstance(content, list):
        if not all(
            isinstance(part, Mapping) and isinstance(part.get("type"), str) for part in content
        ):
            raise InvalidInputError(f"{where}: every content part needs a string 'type'")
    elif not isinstance(content, str):
        raise InvalidInputError(
            f"{where}: 'content' must be a string, a list of content parts or None"
        )
    return dict(message)


def _routing_view(message: Mapping[str, Any]) -> dict[str, str]:
    """``message`` as role and text for route keys: text parts as they are, any other
    part (an image, audio) and the tool calls as a short digest of their JSON, so an
    equal part gives an equal key and a large one does not inflate the token estimate."""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    else:
        text = "".join(
            str(part["text"]) if part["type"] == "text" and "text" in part else _digest(part)
            for part in content or ()
        )
    if message.get("tool_calls"):
        text += _digest(message["tool_calls"])
    return {"role": str(message["role"]), "content": text}


def _digest(value: object) -> str:
    encoded = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return f"<{hashlib.blake2b(encoded, digest_size=8).hexdigest()}>"


def serialise(
    payload: PromptInput, template: ChatTemplate | None = None, *, completion: bool = False
) -> PromptText:
    """The routing text of ``payload`` and its known boundaries (messages rendered with
    ``template`` when known; a string scanned for its turn ends). ``completion``: a
    Prompt is sent as its :attr:`~contextpilot_rag.prompt.Prompt.text` (message contents
    joined by blank lines), its block and message ends kept. Raises
    :class:`InvalidInputError` for anything but a Prompt, chat messages or a string."""
    if isinstance(payload, str):
        ends = template.scan(payload) if template is not None else []
        return PromptText(payload, tuple(sorted({*ends, len(payload)})))
    sent: tuple[dict[str, Any], ...]
    if isinstance(payload, Prompt):
        messages = tuple(dict(m) for m in payload.messages)
        sent = messages
    elif isinstance(payload, Sequence) and payload:
        sent = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(payload))
        messages = tuple(_routing_view(m) for m in sent)
    else:
        raise InvalidInputError(
            "expected a Prompt, a non-empty list of chat messages or a completion string, "
            f"got {type(payload).__name__}"
        )
    if completion and isinstance(payload, Prompt):
        text, starts, _ = _TEXT.render(messages)
        text = text[: -len(_TEXT.end)]  # Prompt.text has no trailing separator
        # a message ends before its separator: the whole of the last message's text is
        # then a boundary that the next turn's prompt (which extends it) shares
        ends = [start + len(m["content"]) for start, m in zip(starts, messages, strict=True)]
    else:
        text, starts, ends = (template or _PLAIN).render(messages)
    boundaries = set(ends)
    if isinstance(payload, Prompt):
        boundaries.update(
            starts[b.message_index] + b.char_end
            for b in payload.boundaries
            if 0 <= b.message_index < len(starts)
        )
    return PromptText(text, tuple(sorted(boundaries)), sent)


def route_salt(salt: str | None) -> int:
    """What the block hashes of a prompt sent with ``salt`` are XOR-ed with: 63 bits of
    a keyed BLAKE2b digest of it (0 without a salt). One-way, so route keys (shared
    through a route store) do not reveal the salt, a capability (``docs/tenants.md``)."""
    if salt is None:
        return 0
    digest = hashlib.blake2b(salt.encode("utf-8"), digest_size=8, person=b"cp-route-salt")
    return int.from_bytes(digest.digest(), "big") & _MASK63


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
        self.first_block_chars = int(block_tokens * chars_per_token)  # fixed: see the module

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
        may_hold: bool = False,
        salt: str | None = None,
    ) -> RouteRequest:
        """The :class:`RouteRequest` of a serialised prompt; ``salt``: the
        ``cache_salt`` it is sent with (its keys are then that salt's, see the module)."""
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
            if b < 2 or b in keyed:
                # inside the first block or ending in the second (its key would replace
                # block 0's, which must not depend on the refined estimate), or a block
                # already keyed (keep the first)
                continue
            crc = zlib.crc32(body[done:position].encode(), crc)
            done = position
            keyed[b] = ((position << 32) | crc) & _MASK63
        if blocks:
            first = min(len(body), self.first_block_chars)
            hashes[0] = ((first << 32) | zlib.crc32(body[:first].encode())) & _MASK63
        for b, key in keyed.items():
            hashes[b - 1] = key
        mask = route_salt(salt)
        return RouteRequest(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            block_hashes=tuple(h ^ mask for h in hashes) if mask else tuple(hashes),
            block_tokens=block,
            expected_output_tokens=expected_output_tokens,
            boundaries=tuple(sorted(keyed)),
            session=session,
            arrival_s=arrival_s,
            features=dict(features or {}),
            logical_id=logical_id,
            attempt=attempt,
            excluded=excluded,
            may_hold=may_hold,
        )
