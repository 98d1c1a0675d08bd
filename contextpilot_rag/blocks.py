"""Context blocks: the unit that is reordered, de-duplicated and cached.

A block's identity is its ``id``; by default the id is a hash of its text, so the same
text is the same block wherever it comes from. A block always renders to the same bytes
(:func:`render_block`): its label is derived from the id, never from its position, which
is what lets an engine reuse the cached tokens of a block at the same prefix offset.

Labels are short on purpose: every block's label line and every note that names it are
prompt tokens paid on each request. A short plain id is its own label; a longer id shows
as five letters of its hash (:func:`block_label`), and :attr:`Prompt.labels` maps the
labels back to the ids.
"""

from __future__ import annotations

import hashlib
import re
import reprlib
import string
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NewType, TypeGuard

from .errors import (
    BlockConflictError,
    ConfigError,
    EmptyContextError,
    InvalidBlockError,
    InvalidInputError,
    OversizeBlockError,
)
from .escaping import CONTROL_TOKEN, StructureGuard

__all__ = [
    "MAX_ID_CHARS",
    "RESERVED_ID_PREFIX",
    "BlockId",
    "BlockRegistry",
    "ContextBlock",
    "LabelStyle",
    "RegisteredBlock",
    "block_label",
    "check_encodable",
    "content_id",
    "render_block",
    "shown_label",
    "unique_label",
    "validate_blocks",
]

BlockId = NewType("BlockId", str)

LabelStyle = Literal["short", "id"]
"""How a block id becomes its label (see :func:`block_label`)."""

_LABEL_STYLES: tuple[LabelStyle, ...] = ("short", "id")
RESERVED_ID_PREFIX = "\x00"
"""Block ids may not start with this: the pilot's own index and registry keys do."""
MAX_ID_CHARS = 4096
"""The longest block or conversation id: ids are keys of the pilot's state and stores
and are quoted in errors, which a 10 MB id made 10 MB long (a URL fits easily)."""


def check_id_length(name: str, value: str, error: type[Exception]) -> None:
    """Raise ``error`` if ``value`` (the id ``name``) is longer than
    :data:`MAX_ID_CHARS`, quoting only its start."""
    if len(value) > MAX_ID_CHARS:
        raise error(
            f"{name} has {len(value):,} characters, over the {MAX_ID_CHARS:,} an id may "
            f"have; it starts {value[:40]!r}"
        )


_ID_HEX_CHARS = 16
_LABEL_HEX_CHARS = 8
_SHORT_ID_CHARS = 12  # an id up to this long is its own label in the "short" style
_SHORT_LABEL_LETTERS = 5  # 26**5: a 100-block conversation has a shared label 1 time in 2,400
_SAFE_LABEL = re.compile(r"^[A-Za-z0-9_.:\-]{1,32}\Z")
_CONTENT_ID = re.compile(rf"^[0-9a-f]{{{_ID_HEX_CHARS}}}\Z")
_PLAIN_LABEL = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")  # any label unique_label() makes


def content_id(text: str) -> BlockId:
    """The default id of a block: a short SHA-256 of its text."""
    return BlockId(hashlib.sha256(text.encode("utf-8")).hexdigest()[:_ID_HEX_CHARS])


def check_encodable(
    name: str, text: str, error: type[InvalidInputError] = InvalidInputError
) -> None:
    """Raise ``error`` when ``text`` cannot be sent as UTF-8 (a lone surrogate)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise error(
                f"{name} holds a character that is not valid Unicode text "
                f"({text[exc.start]!r} at position {exc.start}, a lone surrogate); "
                "decode the source with errors='replace'"
            ) from None


def _check_given_id(block_id: object) -> None:
    """A caller's block id: a non-empty, encodable str of at most :data:`MAX_ID_CHARS`
    characters that does not start with :data:`RESERVED_ID_PREFIX`."""
    if not isinstance(block_id, str) or not block_id:
        shown = reprlib.repr(block_id)  # whatever it is, a bounded part of it
        raise InvalidBlockError(f"ContextBlock.id must be a non-empty str, got {shown}")
    check_id_length("ContextBlock.id", block_id, InvalidBlockError)
    if block_id.startswith(RESERVED_ID_PREFIX):
        # the pilot's own keys (a tenant's blocks, the system prompt, a request's
        # tail) start so: an id of that form could reach another tenant's state
        raise InvalidBlockError(
            f"ContextBlock.id must not start with {RESERVED_ID_PREFIX!r} (reserved), "
            f"got {block_id[:40]!r}"
        )
    check_encodable("ContextBlock.id", block_id, InvalidBlockError)


@dataclass(frozen=True, eq=False)
class ContextBlock:
    """One retrieved document, chunk or memory.

    ``id`` defaults to :func:`content_id` of ``text``. ``score`` is the retriever's
    relevance score (informational). ``metadata`` is copied into a read-only mapping.
    Equality and hashing use ``(id, text)``; metadata and score do not change identity.
    ``digest`` is :func:`content_id` of the text whatever the id: conversations keep it
    to tell a block they showed from a changed text under the same id. An ``id``
    starting with a NUL character (:data:`RESERVED_ID_PREFIX`) is refused: the pilot's
    own keys start so.

    ``shared`` marks a public block (a public corpus, a manual every tenant reads): in
    a prompt with a ``tenant`` it may share a cached prefix with other tenants' prompts
    (``docs/tenants.md``); without a tenant it changes nothing. Like ``score``, it does
    not change identity.
    """

    text: str
    id: str = field(default=None)  # type: ignore[assignment]
    score: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    shared: bool = field(default=False, compare=False)
    label: str = field(init=False, repr=False, compare=False)
    """The position-independent label used in the rendered prompt and notes:
    :func:`block_label` of the id (unless another block of the same prompt has it, or
    the pilot shows full ids: see :attr:`Prompt.labels`)."""
    digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InvalidBlockError(
                f"ContextBlock.text must be str, got {type(self.text).__name__}"
            )
        if not self.text.strip():
            raise InvalidBlockError("ContextBlock.text is empty; drop empty blocks before passing")
        check_encodable("ContextBlock.text", self.text, InvalidBlockError)
        digest = content_id(self.text)
        object.__setattr__(self, "digest", digest)
        if self.id is None:
            object.__setattr__(self, "id", digest)
        else:  # a given id is checked; the digest needs no check
            _check_given_id(self.id)
        if self.score is not None and (
            isinstance(self.score, bool) or not isinstance(self.score, (int, float))
        ):
            raise InvalidBlockError(f"ContextBlock.score must be a number, got {self.score!r}")
        if not isinstance(self.metadata, Mapping):
            raise InvalidBlockError("ContextBlock.metadata must be a mapping")
        if not isinstance(self.shared, bool):
            raise InvalidBlockError(f"ContextBlock.shared must be a bool, got {self.shared!r}")
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "label", block_label(self.id))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ContextBlock):
            return NotImplemented
        return self.id == other.id and self.text == other.text

    def __hash__(self) -> int:
        return hash((self.id, self.text))


def block_label(block_id: str, style: LabelStyle = "short") -> str:
    """A printable label for a block id, depending on the id only (so a block renders
    to the same bytes in every prompt).

    ``"short"`` (the default): the id itself when it has at most 12 plain characters
    (letters, digits, ``_ . : -``), otherwise five lowercase letters of its SHA-256
    (``837407666_1762-2394-0-632`` costs 15 cl100k tokens as a label line, its label
    about 4). ``"id"``: the id itself up to 32 plain characters, the first 8 characters
    of a content-hash id, otherwise 8 hex characters of its SHA-256. In both, an id
    that would read as a chat-template control token (``INST`` makes ``[INST]``) is
    hashed. Raises :class:`ConfigError` for another style."""
    if style == "short":
        if len(block_id) <= _SHORT_ID_CHARS and _is_plain(block_id):
            return block_id
        return _letters(block_id)
    if style == "id":
        if _CONTENT_ID.match(block_id):
            return block_id[:_LABEL_HEX_CHARS]
        return block_id if _is_plain(block_id) else _hashed(block_id)
    raise ConfigError(f"label style must be one of {_LABEL_STYLES}, got {style!r}")


def _is_plain(block_id: str) -> bool:
    return bool(_SAFE_LABEL.match(block_id)) and not CONTROL_TOKEN.fullmatch(f"[{block_id}]")


def _hashed(text: str, hex_chars: int = _LABEL_HEX_CHARS) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:hex_chars]


def _letters(text: str, count: int = _SHORT_LABEL_LETTERS) -> str:
    """``count`` lowercase letters of the SHA-256 of ``text``: cheaper in tokens than
    hex or base32 of the same entropy, and never a control token (those need capitals
    or ``<``)."""
    value = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    letters = []
    for _ in range(count):
        value, digit = divmod(value, 26)
        letters.append(string.ascii_lowercase[digit])
    return "".join(letters)


def unique_label(block: ContextBlock, taken: Mapping[str, str], own: str | None = None) -> str:
    """The label ``block`` shows in a prompt whose other blocks already hold the
    labels in ``taken`` (label → block id): its own label (``own``, by default its
    :attr:`~ContextBlock.label`) unless another block holds it, then a longer one
    derived from its id alone, so the same collision always resolves to the same
    bytes."""
    label = block.label if own is None else own
    owner = taken.get(label)
    if owner is None or owner == block.id:
        return label
    longer = [block.id[:12], block.id] if _CONTENT_ID.match(block.id) else []
    longer += [f"{label}-{_hashed(block.id, 6)}", f"{label}-{_hashed(block.id, 16)}"]
    for candidate in longer:
        owner = taken.get(candidate)
        if owner is None or owner == block.id:
            return candidate
    number = 2
    while taken.get(f"{longer[-1]}-{number}", block.id) != block.id:
        number += 1
    return f"{longer[-1]}-{number}"


def shown_label(block: ContextBlock, reported: object) -> str:
    """The label to render ``block`` under when an outside record (document metadata
    an adapter wrote) reports the one a prompt showed: ``reported`` when it is a label
    the pilot could have made, the block's own label otherwise (a forged record cannot
    inject text through it)."""
    if (
        isinstance(reported, str)
        and _PLAIN_LABEL.fullmatch(reported)
        and not CONTROL_TOKEN.fullmatch(f"[{reported}]")
    ):
        return reported
    return block.label


_DEFAULT_GUARD = StructureGuard(())


def render_block(
    block: ContextBlock, guard: StructureGuard | None = None, *, label: str | None = None
) -> str:
    """The exact text a block contributes to a prompt (same bytes at any position):
    its label line, then its text escaped by ``guard`` (control tokens and label-like
    lines only, when no guard is given)."""
    text = (guard or _DEFAULT_GUARD).escape(block.text.strip())
    return f"[{label or block.label}]\n{text}\n\n"


def is_list_like(value: object) -> TypeGuard[Iterable[object]]:
    """An iterable that is not a string, bytes or a mapping: what a list argument
    may be."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


def validate_blocks(blocks: object, *, allow_empty: bool = False) -> tuple[ContextBlock, ...]:
    """Check a request's blocks: a sequence of :class:`ContextBlock` (non-empty unless
    ``allow_empty``), no id used for two different texts. Exact repeats (same id, same
    text) are collapsed to their first occurrence. Raises before anything is stored."""
    if not is_list_like(blocks):
        raise InvalidBlockError(
            f"blocks must be a list of ContextBlock, got {type(blocks).__name__}"
        )
    unique: dict[str, ContextBlock] = {}
    for position, block in enumerate(blocks):
        if not isinstance(block, ContextBlock):
            raise InvalidBlockError(
                f"blocks[{position}] is {type(block).__name__}, expected ContextBlock "
                "(wrap text with ContextBlock(text))"
            )
        seen = unique.get(block.id)
        if seen is None:
            unique[block.id] = block
        elif seen.text != block.text:
            raise BlockConflictError(
                f"block id {block.id!r} is used for two different texts in one request"
            )
    if not unique and not allow_empty:
        raise EmptyContextError(
            "no context blocks given; pass at least one ContextBlock (a conversation's "
            "turn may have none: pass its conversation_id)"
        )
    return tuple(unique.values())


@dataclass(frozen=True)
class RegisteredBlock:
    """What the registry remembers of a block: its text, its rendering, the token
    count of that rendering, the label it renders under and that label's token count
    as notes cite it (after a space)."""

    text: str
    rendered: str
    tokens: int
    label_tokens: int
    label: str


def _render_labeled(block: ContextBlock, label: str) -> str:
    return render_block(block, label=label)


class BlockRegistry:
    """Block id → text, label, rendering and token count, for the ids seen recently.

    Three jobs: it caches labels, renderings and token counts (each block is labeled,
    rendered and tokenized once while it stays here), it catches an id reused for a
    different text across calls, and it counts how many requests carried each block
    (its popularity) and which of the last ``window`` requests carried it
    (:meth:`together`). ``render(block, label)`` renders a block under a label given
    by ``label_style`` (:func:`block_label`). Bounded to ``capacity`` ids, least
    recently used dropped first, and ``window`` requests. Not thread-safe by itself.

    Entries are keyed by block id, or by the ``keys`` a caller passes alongside the
    blocks (one per block): the pilot keys a tenant's private blocks apart from other
    tenants' (:func:`~contextpilot_rag.tenants.registry_key`), so the id checks and the
    popularity counts of one key space never see another's.
    """

    def __init__(
        self,
        count_tokens: Callable[[str], int],
        *,
        capacity: int = 200_000,
        label_style: LabelStyle = "short",
        render: Callable[[ContextBlock, str], str] = _render_labeled,
        window: int = 0,
    ) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ConfigError("block registry capacity must be a positive int")
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ConfigError("block registry window must be an int >= 0")
        if label_style not in _LABEL_STYLES:
            raise ConfigError(f"label_style must be one of {_LABEL_STYLES}, got {label_style!r}")
        self._count = count_tokens
        self._label_style = label_style
        self._render = render
        self._capacity = capacity
        self._entries: OrderedDict[str, RegisteredBlock] = OrderedDict()
        self._requests_with: dict[str, int] = {}
        self._requests_counted = 0  # requests committed or carried, for popularity shares
        # keys counted for other pilots' requests (count_carried), least recent first
        self._carried: OrderedDict[str, None] = OrderedDict()
        # the last ``window`` requests' keys, one slot each (reused in turn), and per
        # key the slots that carry it as the bits of an int
        self._slots: list[tuple[str, ...]] = [()] * window
        self._next_slot = 0
        self._recent = 0  # requests in the window: min(requests remembered, window)
        self._together: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def popularity(self, block_id: str) -> int:
        """How many committed requests carried ``block_id`` (or the block of that
        key) while it stayed here."""
        return self._requests_with.get(block_id, 0)

    def together(self, block_id: str) -> int:
        """Which of the last ``window`` requests counted carried ``block_id`` (or the
        block of that key): one bit per request, so ``together(a) & together(b)``
        are those that carried both and ``int.bit_count`` counts them."""
        return self._together.get(block_id, 0)

    @property
    def recent(self) -> int:
        """How many requests :meth:`together` covers: those counted, up to ``window``."""
        return self._recent

    def _remember_together(self, keys: Iterable[str]) -> None:
        """Put one request's keys in the oldest slot of the window, forgetting the
        request there before."""
        slots = self._slots
        if not slots:
            return
        slot, together = self._next_slot, self._together
        bit = 1 << slot
        for key in slots[slot]:  # each holds the bit: clear it (xor is cheaper than & ~)
            left = together[key] ^ bit
            if left:
                together[key] = left
            else:
                del together[key]
        kept = tuple(dict.fromkeys(keys))
        get = together.get
        for key in kept:
            together[key] = get(key, 0) | bit
        slots[slot] = kept
        self._next_slot = (slot + 1) % len(slots)
        self._recent = min(self._recent + 1, len(slots))

    @property
    def requests_counted(self) -> int:
        """How many requests :meth:`commit` and :meth:`count_carried` counted."""
        return self._requests_counted

    def count_carried(self, keys: Iterable[str], *, together: bool = True) -> None:
        """Count a request another pilot committed (replayed from a shared store's
        index log) in the popularity of ``keys`` (and with ``together``, in
        :meth:`together`). A key without an entry here is counted too; at most
        ``capacity`` such keys are remembered, the least recently counted forgotten
        first (with its count, unless it has an entry by then)."""
        counts, carried, stored = self._requests_with, self._carried, self._entries
        self._requests_counted += 1
        keys = list(keys)
        if together:
            self._remember_together(keys)
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
            carried[key] = None
            carried.move_to_end(key)
        while len(carried) > self._capacity:
            dropped, _ = carried.popitem(last=False)
            if dropped not in stored:
                counts.pop(dropped, None)

    def prepare(
        self,
        blocks: Sequence[ContextBlock],
        max_tokens: int | None,
        max_chars: int | None = None,
        keys: Sequence[str] | None = None,
    ) -> dict[str, RegisteredBlock]:
        """Entries for the blocks not stored yet, by key, computed without the caller's
        lock (tokenizing a long block then holds up no other request); pass them to
        :meth:`resolve` with the same ``keys``. Reading the store here needs no lock: a
        stale answer only computes an entry that :meth:`resolve` then checks or ignores.
        Raises :class:`OversizeBlockError`."""
        stored = self._entries
        if keys is None:
            return {
                block.id: self._new_entry(block, max_tokens, max_chars)
                for block in [block for block in blocks if block.id not in stored]
            }
        return {
            key: self._new_entry(block, max_tokens, max_chars)
            for block, key in zip(blocks, keys, strict=True)
            if key not in stored
        }

    def _new_entry(
        self, block: ContextBlock, max_tokens: int | None, max_chars: int | None
    ) -> RegisteredBlock:
        """A new block's entry; its size checked, by length before tokenizing."""
        if max_chars is not None and len(block.text) > max_chars:
            raise OversizeBlockError(
                f"block {block.id!r} has {len(block.text)} characters, over the {max_chars} "
                f"that max_block_tokens={max_tokens} allows (PilotConfig.max_block_chars); "
                "split it into smaller chunks"
            )
        label = block.label if self._label_style == "short" else block_label(block.id, "id")
        rendered = self._render(block, label)
        entry = RegisteredBlock(
            block.text, rendered, self._count(rendered), self._count(" " + label), label
        )
        if max_tokens is not None and entry.tokens > max_tokens:
            raise OversizeBlockError(
                f"block {block.id!r} has {entry.tokens} tokens, over "
                f"max_block_tokens={max_tokens}; split it into smaller chunks"
            )
        return entry

    def resolve(
        self,
        blocks: Sequence[ContextBlock],
        max_tokens: int | None,
        prepared: Mapping[str, RegisteredBlock] | None = None,
        max_chars: int | None = None,
        keys: Sequence[str] | None = None,
    ) -> tuple[RegisteredBlock, ...]:
        """The entries of ``blocks`` (new ones computed, or taken from ``prepared``;
        nothing stored), looked up by ``keys`` (default: the block ids). Raises
        :class:`BlockConflictError` or :class:`OversizeBlockError`."""
        resolved = []
        stored = self._entries
        ids = [block.id for block in blocks] if keys is None else keys
        for block, key in zip(blocks, ids, strict=True):
            entry = stored.get(key)
            if entry is None:  # stored entries passed the size checks when they were new
                entry = (prepared or {}).get(key)
                if entry is None or entry.text != block.text:
                    entry = self._new_entry(block, max_tokens, max_chars)
            elif entry.text is not block.text and entry.text != block.text:
                raise BlockConflictError(
                    f"block id {block.id!r} was registered with a different text; "
                    "distinct texts need distinct ids"
                )
            resolved.append(entry)
        return tuple(resolved)

    def commit(
        self,
        blocks: Sequence[ContextBlock],
        entries: Sequence[RegisteredBlock],
        keys: Sequence[str] | None = None,
        *,
        together: bool = True,
    ) -> None:
        """Store (or refresh) the entries :meth:`resolve` returned for one request,
        under ``keys`` (default: the block ids); with ``together``, remember the request
        in :meth:`together`'s window."""
        counts, stored = self._requests_with, self._entries
        self._requests_counted += 1
        ids = [block.id for block in blocks] if keys is None else keys
        for block_id, entry in zip(ids, entries, strict=True):
            if block_id in stored:
                stored.move_to_end(block_id)  # same text: resolve() checked it
            else:
                stored[block_id] = entry
            counts[block_id] = counts.get(block_id, 0) + 1
        if together:
            self._remember_together(ids)
        while len(self._entries) > self._capacity:
            dropped, _ = self._entries.popitem(last=False)
            counts.pop(dropped, None)
