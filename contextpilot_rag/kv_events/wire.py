"""vLLM's KV-event wire format, decoded with msgspec (the ``kv-events`` extra).

A message is three ZMQ frames: the topic, the batch sequence number (8 bytes,
big-endian, from 0 per publisher run) and a msgpack payload: the positional array
``[ts, [event, ...], data_parallel_rank]`` of vLLM's ``KVEventBatch``. Each event is a
map tagged by ``"type"`` (msgspec ``tag=True``): ``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``; fields equal to their defaults may be left out. Block hashes
are msgpack uint64 (decoded unsigned: values above 2**63 stay positive) or bin.
Unknown fields are ignored and unknown event types counted, so a newer engine does
not break decoding.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import msgspec

from ..errors import InvalidInputError
from .events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent

__all__ = ["END_SEQ", "SEQ_BYTES", "decode_batch", "decode_seq", "encode_seq"]

SEQ_BYTES = 8
END_SEQ = b"\xff" * SEQ_BYTES
"""The sequence frame of the replay end marker (vLLM: ``(-1).to_bytes(8, signed)``)."""


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _Tag(msgspec.Struct):
    type: str


class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int | bytes]
    token_ids: list[int]
    block_size: int
    parent_block_hash: int | bytes | None = None
    lora_id: int | None = None
    medium: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


_KNOWN_TYPES = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})
_batch_decoder = msgspec.msgpack.Decoder(_Batch)
_tag_decoder = msgspec.msgpack.Decoder(_Tag)
_event_decoder = msgspec.msgpack.Decoder(_Stored | _Removed | _Cleared)


def decode_seq(frame: bytes) -> int:
    """The sequence number of a sequence frame."""
    if len(frame) != SEQ_BYTES:
        raise InvalidInputError(f"a sequence frame has {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def encode_seq(seq: int) -> bytes:
    """The sequence frame of ``seq`` (a replay request's start)."""
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """The events of one payload. Raises :class:`~contextpilot_rag.errors.InvalidInputError`
    for anything that is not a well-formed batch; events of unknown types are left out
    and counted in :attr:`EventBatch.unknown_events`."""
    try:
        batch = _batch_decoder.decode(payload)
    except _MALFORMED as exc:
        raise InvalidInputError(f"malformed KV-event batch {seq}: {exc!r}") from exc
    events: list[KVEvent] = []
    unknown = 0
    for raw in batch.events:
        event = _decode_event(seq, raw)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return EventBatch(seq, batch.ts, tuple(events), batch.data_parallel_rank, unknown)


def _decode_event(seq: int, raw: msgspec.Raw) -> KVEvent | None:
    """One event, or ``None`` for a well-formed event of an unknown type."""
    try:
        wire = _event_decoder.decode(raw)
    except _MALFORMED as exc:
        try:
            tag = _tag_decoder.decode(raw).type
        except _MALFORMED:
            tag = None
        if tag is not None and tag not in _KNOWN_TYPES:
            return None
        raise InvalidInputError(f"malformed KV event in batch {seq}: {exc!r}") from exc
    try:
        return _event_of(wire)
    except (TypeError, ValueError, RecursionError) as exc:  # extra keys beyond hashing
        raise InvalidInputError(f"malformed KV event in batch {seq}: {exc!r}") from exc


def _event_of(wire: Any) -> KVEvent:
    if isinstance(wire, _Stored):
        return BlockStored(
            block_hashes=tuple(wire.block_hashes),
            parent_block_hash=wire.parent_block_hash,
            token_ids=tuple(wire.token_ids),
            block_size=wire.block_size,
            extra_keys=None if wire.extra_keys is None else _freeze_extra(wire.extra_keys),
            medium=wire.medium,
            group_idx=wire.group_idx,
            lora_id=wire.lora_id,
        )
    if isinstance(wire, _Removed):
        return BlockRemoved(tuple(wire.block_hashes), wire.medium, wire.group_idx)
    return AllBlocksCleared()


# msgspec's own errors, and a payload nested deeper than the interpreter recurses
_MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def _first(pair: tuple[str, Hashable]) -> str:
    return pair[0]


def _freeze_extra(
    extra_keys: list[list[Any] | None],
) -> tuple[tuple[Hashable, ...] | None, ...]:
    return tuple(None if keys is None else tuple(map(_freeze, keys)) for keys in extra_keys)


def _freeze(value: Any) -> Hashable:
    """msgpack arrays decode as lists: tuples instead, so that keys hash."""
    if isinstance(value, list):
        return tuple(map(_freeze, value))
    if isinstance(value, dict):  # keys of several types: ordered by their repr
        return tuple(sorted(((repr(k), _freeze(v)) for k, v in value.items()), key=_first))
    if isinstance(value, Hashable):
        return value
    raise InvalidInputError(f"unhashable extra key {value!r}")
