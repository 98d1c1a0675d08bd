"""The context index shared through a store's index log (docs/stores.md, "The context
index"): pilots on one Redis or SQLite store order documents as one pilot would; the
log is bounded, gaps and damaged records are counted and skipped, tenants stay apart,
and a store that is down costs sharing, never a prompt."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
from contextpilot_rag.errors import ConfigError, StoreError, StoreUnavailableError
from contextpilot_rag.index_sync import (
    IndexLogConfig,
    IndexRecord,
    IndexSync,
    LoggedPlacement,
    decode_record,
    encode_record,
)
from contextpilot_rag.stores.index_log import IndexLog, index_log_of
from contextpilot_rag.stores.redis_index_log import RedisIndexLog
from contextpilot_rag.stores.sqlite_index_log import SQLiteIndexLog
from contextpilot_rag.tenants import TenantConfig

DOCS = {f"d{i}": ContextBlock(f"Document {i}. " + f"Facts about topic {i}. " * 20, id=f"d{i}")
        for i in range(40)}  # fmt: skip
EAGER = IndexLogConfig(replay_interval_s=0.0)  # replay before every call: deterministic


def docs(*ids: str) -> list[ContextBlock]:
    return [DOCS[block_id] for block_id in ids]


def order(prompt: Any) -> list[str]:
    return [block.id for block in prompt.blocks]


@dataclass
class Shared:
    """A shared store: its URL, and the log under it (to look at the log itself)."""

    backend: str
    url: str

    def pilot(
        self, config: IndexLogConfig = EAGER, *, write_behind: bool = False, **options: Any
    ) -> ContextPilot:
        return pilot_on(self.url, config, write_behind=write_behind, **options)

    def log(self, max_entries: int = 10_000) -> IndexLog:
        if self.backend == "redis":
            return RedisIndexLog(self.url, max_entries=max_entries)
        return SQLiteIndexLog(self.url.removeprefix("sqlite:///"), max_entries=max_entries)


def pilot_on(
    store: Any, config: IndexLogConfig = EAGER, *, write_behind: bool = False, **options: Any
) -> ContextPilot:
    """A pilot on ``store``; unless ``write_behind``, each call returns once its record
    is in the log (deterministic tests: the writer is flushed)."""
    pilot = ContextPilot(PilotConfig(index_log=config, **options), store=store)
    if not write_behind and pilot._index_sync is not None:
        synchronous(pilot._index_sync)
    return pilot


def synchronous(sync: IndexSync) -> None:
    """Make ``sync`` append before :meth:`IndexSync.publish` returns."""
    publish = sync.publish

    def publish_and_flush(records: Sequence[IndexRecord]) -> None:
        publish(records)
        sync.flush()

    sync.publish = publish_and_flush  # type: ignore[method-assign]


@pytest.fixture(params=["sqlite", "redis"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Shared:
    if request.param == "redis":
        return Shared("redis", request.getfixturevalue("redis_url"))
    return Shared("sqlite", f"sqlite:///{tmp_path / 'state.db'}")


@pytest.fixture
def log(shared: Shared) -> Iterator[IndexLog]:
    opened = shared.log(max_entries=10)
    yield opened
    opened.close()


# -- two pilots, one store ------------------------------------------------------------


def test_a_pilot_orders_a_request_to_share_the_prefix_another_pilot_sent(
    shared: Shared,
) -> None:
    first, second = shared.pilot(), shared.pilot()
    assert order(first.optimize(docs("d3", "d1", "d5", "d2"), "q1")) == ["d3", "d1", "d5", "d2"]
    request = docs("d5", "d1", "d3", "d9")
    aligned = second.optimize(request, "q2")
    one_pilot = ContextPilot()  # what a single pilot that saw both requests does
    one_pilot.optimize(docs("d3", "d1", "d5", "d2"), "q1")
    assert order(aligned) == order(one_pilot.optimize(request, "q2")) == ["d3", "d1", "d5", "d9"]
    assert aligned.stats.blocks_matched == 3
    alone = shared.pilot(IndexLogConfig(enabled=False))  # same store, no index log
    assert order(alone.optimize(request, "q2")) == ["d5", "d1", "d3", "d9"]
    assert alone.index_log_stats() is None


def test_popularity_counts_are_shared(shared: Shared) -> None:
    first, second = shared.pilot(), shared.pilot()
    first.optimize(docs("d1", "d7", "d8"), "q1")
    first.optimize(docs("d2", "d8", "d7"), "q2")  # d7, d8 now carried twice: popular
    request = docs("d4", "d8", "d7", "d6")  # no indexed path starts with any of them
    one_pilot = ContextPilot()
    one_pilot.optimize(docs("d1", "d7", "d8"), "q1")
    one_pilot.optimize(docs("d2", "d8", "d7"), "q2")
    expected = order(one_pilot.optimize(request, "q3"))
    assert expected == ["d7", "d8", "d4", "d6"]
    assert order(second.optimize(request, "q3")) == expected
    assert order(ContextPilot().optimize(request, "q3")) == ["d4", "d8", "d7", "d6"]


def test_a_pilot_skips_its_own_records(shared: Shared) -> None:
    pilot = shared.pilot()
    for n in range(3):
        pilot.optimize(docs(f"d{n}", "d9"), f"q{n}")
    stats = pilot.index_log_stats()
    assert stats is not None and stats.appended == 3 and stats.replayed == 0
    assert pilot.index_stats().requests == 3


def test_a_batch_is_shared_too(shared: Shared) -> None:
    first, second = shared.pilot(), shared.pilot()
    prompts = first.optimize_batch([(docs("d1", "d2", "d3"), "q1"), (docs("d3", "d2", "d4"), "q2")])
    sent = order(prompts[0])
    request = docs(*reversed(sent[:2]), "d9")
    assert order(second.optimize(request, "q3"))[:2] == sent[:2]


def test_tenants_share_only_their_own_requests(shared: Shared) -> None:
    tenants = TenantConfig(salt_key="an example salt key")
    first, second = shared.pilot(tenants=tenants), shared.pilot(tenants=tenants)
    first.optimize(docs("d3", "d1", "d5", "d2"), "q1", tenant="x")
    request = docs("d5", "d1", "d3", "d9")
    assert order(second.optimize(request, "q2", tenant="y")) == ["d5", "d1", "d3", "d9"]
    assert order(second.optimize(request, "q2", tenant="x")) == ["d3", "d1", "d5", "d9"]
    assert order(second.optimize(request, "q2")) == ["d5", "d1", "d3", "d9"]  # no tenant
    assert second.index_stats(tenant="y").requests == 1  # its own prompt only


def test_a_conversation_continued_by_another_pilot_finds_its_history_indexed(
    shared: Shared,
) -> None:
    first, second = shared.pilot(), shared.pilot()
    turn = first.optimize(docs("d1", "d2"), "q1", conversation_id="c")
    first.record_answer(turn, "an answer")
    one_pilot = ContextPilot()
    kept = one_pilot.optimize(docs("d1", "d2"), "q1", conversation_id="c")
    one_pilot.record_answer(kept, "an answer")
    following = second.optimize(docs("d2", "d3"), "q2", conversation_id="c")
    expected = one_pilot.optimize(docs("d2", "d3"), "q2", conversation_id="c")
    assert following.messages == expected.messages
    assert following.stats == expected.stats
    assert following.stats.reusable_tokens > 0  # the history's prefix, sent by the first


class CountingLog:
    """An index log that counts the calls each thread makes to it."""

    def __init__(self, log: IndexLog) -> None:
        self.log, self.max_entries = log, log.max_entries
        self.calls: list[tuple[str, str]] = []  # (method, thread name)

    def append(self, origin: str, records: Any, *, after: int, limit: int) -> Any:
        self.calls.append(("append", threading.current_thread().name))
        return self.log.append(origin, records, after=after, limit=limit)

    def read(self, after: int, limit: int) -> Any:
        self.calls.append(("read", threading.current_thread().name))
        return self.log.read(after, limit)

    def close(self) -> None:
        self.log.close()


def test_a_busy_pilot_calls_the_store_only_from_its_writer_thread(shared: Shared) -> None:
    config = IndexLogConfig(replay_interval_s=60.0)  # no read of its own after the first
    first, second = shared.pilot(config), shared.pilot(config, write_behind=True)
    sync = second._index_sync
    assert sync is not None
    counted = sync.log = CountingLog(sync.log)
    second.optimize(docs("d30"), "warm up")  # the first read, before planning
    first.optimize(docs("d3", "d1", "d5"), "q1")
    second.optimize(docs("d31"), "its writer reads q1 while appending")
    sync.flush()
    aligned = second.optimize(docs("d5", "d1", "d3"), "q2")
    assert order(aligned) == ["d3", "d1", "d5"]
    sync.flush()
    caller = threading.current_thread().name
    assert counted.calls[0] == ("read", caller)
    assert all(name != caller for _, name in counted.calls[1:])
    assert [method for method, _ in counted.calls[1:]] == ["append"] * 3


def test_the_writer_thread_ends_when_idle(shared: Shared) -> None:
    from contextpilot_rag import index_sync

    pilot = shared.pilot(write_behind=True)
    sync = pilot._index_sync
    assert sync is not None
    pilot.optimize(docs("d1"), "q")
    writer = sync._writer
    assert writer is not None
    writer.join(index_sync.WRITER_IDLE_S + 5)
    assert not writer.is_alive() and sync._writer is None
    stats = sync.stats()
    assert stats.appended == 1
    pilot.optimize(docs("d2"), "q2")  # a new writer
    sync.flush()
    assert sync.stats().appended == 2


# -- the log itself -----------------------------------------------------------------------


def test_records_get_consecutive_numbers_and_read_back_in_order(log: IndexLog) -> None:
    assert log.read(0, 5) == ((), 0)
    assert log.append("a", [b"r1", b"r2"], after=0, limit=5) == ((), 2)
    assert log.append("b", [b"r3"], after=0, limit=0) == ((), 3)
    read = log.read(0, 2)
    assert [(r.sequence, r.origin, r.data) for r in read.records] == [
        (1, "a", b"r1"),
        (2, "a", b"r2"),
    ]
    assert read.last == 3
    assert [r.data for r in log.read(2, 5).records] == [b"r3"]
    assert log.read(3, 5) == ((), 3)


def test_an_append_reads_what_precedes_it_in_the_same_call(log: IndexLog) -> None:
    log.append("a", [b"r1", b"r2", b"r3"], after=0, limit=0)
    read = log.append("b", [b"r4"], after=1, limit=5)
    assert [(r.sequence, r.data) for r in read.records] == [(2, b"r2"), (3, b"r3")]
    assert read.last == 4
    assert [r.sequence for r in log.append("b", [b"r5"], after=0, limit=2).records] == [1, 2]


def test_the_log_is_trimmed_to_its_bound(shared: Shared) -> None:
    bounded = shared.log(max_entries=10)
    for n in range(300):
        bounded.append("a", [f"r{n}".encode()], after=0, limit=0)
    held = bounded.read(0, 1000).records
    assert held[-1].sequence == 300
    if shared.backend == "sqlite":  # exact
        assert [r.sequence for r in held] == list(range(291, 301))
    else:  # XADD MAXLEN ~: whole stream nodes, at most one node (100 entries) over
        assert 10 <= len(held) <= 110
        assert [r.sequence for r in held] == list(range(301 - len(held), 301))


def test_a_pilot_that_fell_behind_the_bound_counts_the_gap_and_goes_on(shared: Shared) -> None:
    bounded = IndexLogConfig(max_entries=10, replay_interval_s=0.0, replay_batch=50)
    writer, reader = shared.pilot(bounded), shared.pilot(bounded)
    writer.optimize(docs("d0", "d1"), "q0")
    reader.optimize(docs("d2"), "first")  # read up to the writer's first record
    for n in range(300):
        writer.optimize(docs(f"d{n % 40}", f"d{(n + 7) % 40}"), f"q{n}")
    last = writer.optimize(docs("d38", "d36", "d37"), "the last")
    oldest = shared.log().read(0, 1).records[0].sequence
    for _ in range(5):  # at most 110 records left to read, 50 per call
        reader.optimize(docs("d2"), "catching up")
    stats = reader.index_log_stats()
    assert stats is not None and not stats.degraded
    assert stats.missed == oldest - 3 > 0  # it had read record 1 and written 2
    assert order(reader.optimize(docs("d37", "d36", "d38", "d20"), "q"))[:3] == order(last)


def test_a_damaged_record_is_skipped_and_counted(shared: Shared) -> None:
    first, second = shared.pilot(), shared.pilot()
    shared.log().append("someone", [b"not json", b'{"f": 99}'], after=0, limit=0)
    first.optimize(docs("d3", "d1"), "q1")
    assert order(second.optimize(docs("d1", "d3"), "q2")) == ["d3", "d1"]
    stats = second.index_log_stats()
    assert stats is not None and stats.damaged == 2 and stats.replayed == 1


def test_a_record_reads_back_equal() -> None:
    record = IndexRecord(
        "cp-1-000000001",
        "acme",
        (
            LoggedPlacement("tenant", ("\x00sys:x", "d1", "\x00tail:cp-1"), (10, 20, 3)),
            LoggedPlacement("shared", ("\x00sys:x", "\x00shared:ab:d1"), (10, 20)),
        ),
        ("\x00t4:acme:d1",),
    )
    assert decode_record(encode_record(record)) == record


@pytest.mark.parametrize(
    "data",
    [
        b'{"f":1,"r":"x","t":null,"p":[["tenant",["a"],[1]]],"k":[]}',  # tenant index, no tenant
        b'{"f":1,"r":"x","t":null,"p":[["main",["a","b"],[1]]],"k":[]}',  # lengths differ
        b'{"f":1,"r":"x","t":null,"p":[["main",[],[]]],"k":[]}',  # empty path
        b'{"f":1,"r":"x","t":null,"p":[["main",["a"],[-1]]],"k":[]}',
        b'{"f":1,"r":"","t":null,"p":[],"k":[]}',
        b"[1]",
    ],
)
def test_a_damaged_record_is_a_format_error(data: bytes) -> None:
    from contextpilot_rag.errors import StoreFormatError

    with pytest.raises(StoreFormatError):
        decode_record(data)


def test_a_pilot_whose_log_was_emptied_starts_again(redis_server: Any) -> None:
    redis_server.flush()
    first, second = (pilot_on(redis_server.url()) for _ in range(2))
    for n in range(3):
        first.optimize(docs(f"d{n}", "d9"), f"q{n}")
    second.optimize(docs("d30"), "read them")
    redis_server.flush()  # the store is emptied: the log starts again at 1
    first.optimize(docs("d13", "d11", "d15"), "after the flush")
    assert order(second.optimize(docs("d15", "d11", "d13"), "q")) == ["d13", "d11", "d15"]


# -- the default path and the configuration ------------------------------------------------


def test_the_in_memory_default_has_no_log() -> None:
    pilot = ContextPilot()
    assert pilot._index_sync is None and pilot.index_log_stats() is None
    assert index_log_of(pilot._store) is None


@pytest.mark.parametrize(
    "options",
    [
        {"enabled": 1},
        {"max_entries": 0},
        {"replay_batch": 0},
        {"replay_interval_s": -1.0},
        {"retry_s": "1"},
    ],
)
def test_a_bad_index_log_configuration_is_a_config_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        IndexLogConfig(**options)


def test_a_store_object_shares_its_log(tmp_path: Path) -> None:
    from contextpilot_rag.stores import SQLiteConversationStore

    path = tmp_path / "state.db"
    first = pilot_on(SQLiteConversationStore(path))
    second = pilot_on(SQLiteConversationStore(path))
    first.optimize(docs("d3", "d1", "d5"), "q1")
    assert order(second.optimize(docs("d5", "d1", "d3"), "q2")) == ["d3", "d1", "d5"]


# -- a store that is down ------------------------------------------------------------------


def test_with_redis_down_optimize_plans_on_the_local_index(persistent_redis: Any) -> None:
    config = IndexLogConfig(replay_interval_s=0.0, retry_s=0.2)
    url = persistent_redis.url()
    first, second = (pilot_on(url, config) for _ in range(2))
    first.optimize(docs("d3", "d1", "d5", "d2"), "q1")
    persistent_redis.kill()
    started = time.monotonic()
    prompts = [second.optimize(docs("d5", "d1", "d3", "d9"), f"q{n}") for n in range(5)]
    assert time.monotonic() - started < 3.0
    assert order(prompts[0]) == ["d5", "d1", "d3", "d9"]  # its own index only
    assert order(prompts[-1]) == order(prompts[1]) == ["d5", "d1", "d3", "d9"]
    stats = second.index_log_stats()
    assert stats is not None and stats.degraded and stats.failures >= 1
    assert stats.dropped == 5 and stats.appended == 0
    with pytest.raises(StoreUnavailableError):  # conversations: as before
        second.optimize(docs("d1"), "q", conversation_id="c")
    persistent_redis.start()
    time.sleep(0.25)  # retry_s: then the log is tried again
    back = second.optimize(docs("d7", "d8"), "back")
    stats = second.index_log_stats()
    assert stats is not None and not stats.degraded and stats.appended == 1
    assert stats.replayed == 1  # the first pilot's record, kept by Redis
    assert order(first.optimize(docs("d8", "d7"), "q7")) == order(back) == ["d7", "d8"]


def test_with_a_locked_sqlite_file_optimize_still_answers(tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path / 'state.db'}?busy_timeout_s=0.05"
    pilot = pilot_on(url)
    pilot.optimize(docs("d1"), "q0")
    blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        prompt = pilot.optimize(docs("d2", "d3"), "q1")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert order(prompt) == ["d2", "d3"]
    stats = pilot.index_log_stats()
    assert stats is not None and stats.failures == 1 and stats.dropped == 1 and stats.degraded


def test_serve_workers_share_the_index_unless_told_not_to(redis_url: str) -> None:
    pytest.importorskip("starlette")
    import argparse

    from contextpilot_rag.serve.cli import add_serve_parser, config_from_args
    from contextpilot_rag.serve.proxy import _pilot

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    common = ["serve", "--endpoint", "http://127.0.0.1:1/v1", "--model", "m", "--store", redis_url]
    shared = config_from_args(parser.parse_args(common))
    alone = config_from_args(parser.parse_args([*common, "--no-shared-index"]))
    assert shared.share_index and not alone.share_index
    assert _pilot(shared).index_log_stats() is not None
    assert _pilot(alone).index_log_stats() is None


def test_popularity_counted_for_other_pilots_blocks_is_bounded() -> None:
    from contextpilot_rag.blocks import BlockRegistry

    registry = BlockRegistry(len, capacity=3)
    registry.count_carried(["a", "b"])
    registry.count_carried(["b", "c", "d"])  # four keys: "a", the least recent, is forgotten
    assert [registry.popularity(key) for key in "abcd"] == [0, 2, 1, 1]


def test_concurrent_calls_replay_every_record_once(shared: Shared) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pilots = [shared.pilot(), shared.pilot()]

    def calls(worker: int) -> None:
        pilot = pilots[worker % 2]
        for n in range(15):
            pilot.optimize(docs(f"d{(worker * 7 + n) % 40}", f"d{n % 40}"), f"q{worker}-{n}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(calls, range(4)))
    for pilot in (*pilots, *pilots):  # the first reads all but the second's last record
        pilot.optimize(docs("d39"), "last")
    first, second = (pilot.index_log_stats() for pilot in pilots)
    assert first is not None and second is not None
    assert (first.appended, second.appended) == (32, 32)
    assert (first.replayed, second.replayed) == (31, 32), (first, second)
    assert [pilot.index_stats().requests for pilot in pilots] == [63, 64]


def test_a_full_disk_is_reported_as_such_and_the_log_works_once_space_returns(
    tmp_path: Path,
) -> None:
    """SQLite ends a transaction itself when the disk fills: the error the caller sees
    is that one, not a failed ROLLBACK's."""
    log = SQLiteIndexLog(str(tmp_path / "full.db"), max_entries=1_000)
    log.append("origin", [b"x"], after=0, limit=0)
    db = log._connection()
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    with pytest.raises(StoreError, match="full"):
        log.append("origin", [b"y" * 5_000] * 20, after=0, limit=10)
    db.execute("PRAGMA max_page_count = 1000000")
    assert log.append("origin", [b"z"], after=0, limit=1).last == 2


@pytest.mark.parametrize("same_stand_in", [True, False])
def test_a_stand_in_answer_is_shared_only_with_pilots_that_render_the_same_text(
    shared: Shared, same_stand_in: bool
) -> None:
    """A history turn without its answer shows ``unanswered_text``: a pilot that shows
    other text there does not take the other pilot's prompt as its cached prefix."""
    first = shared.pilot()
    second = shared.pilot(unanswered_text="(no answer)" if same_stand_in else "(pending)")
    first.optimize(docs("d1"), "q1", conversation_id="c")
    first.optimize(docs("d2"), "q2", conversation_id="c")  # turn 1 shows the stand-in
    third = second.optimize(docs("d3"), "q3", conversation_id="c")
    through_first_question = sum(
        second.tokenizer.count(m["content"]) for m in third.messages[:2]
    )  # the system prompt and turn 1's user message
    if same_stand_in:  # the first pilot sent everything up to turn 2's question
        assert third.stats.reusable_tokens > through_first_question
    else:
        assert third.stats.reusable_tokens <= through_first_question
