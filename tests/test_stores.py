"""Conversation stores shared beyond one process: SQLite and Redis (real servers on
loopback, never mocked), the ``store=`` contract, and compare-and-set turns.

One conformance suite runs against every store (memory, SQLite, Redis); the
multi-process tests run pilots in processes of their own (``spawn``) and compare what
they send with one pilot in one process.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, Conversation, PilotConfig, Turn
from contextpilot_rag.batch.requests import BatchRequest
from contextpilot_rag.conversations import (
    InMemoryConversationStore,
    StoredConversation,
    VersionedConversationStore,
)
from contextpilot_rag.errors import (
    ConfigError,
    ConversationConflictError,
    ConversationExpiredError,
    ConversationStateError,
    StoreFormatError,
    StoreUnavailableError,
    UnknownConversationError,
)
from contextpilot_rag.stores import (
    RedisConversationStore,
    SQLiteConversationStore,
    decode_conversation,
    encode_conversation,
    open_store,
    parse_store_url,
)
from contextpilot_rag.stores.sqlite_routes import SQLiteRouteStore

Messages = list[dict[str, str]]
TurnSpec = tuple[tuple[tuple[str, str], ...], str, str]  # ((block id, text), ...), query, answer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# -- a conversation, played in one process or several -------------------------------------


def conversation_turns() -> list[TurnSpec]:
    """Six turns whose documents overlap, so later turns de-duplicate earlier ones."""
    docs = {f"doc{i}": f"Document {i}: facts about topic {i}. " * 12 for i in range(9)}
    picks = [(0, 1, 2), (2, 3, 1), (4, 0, 5), (5, 6, 3), (7, 2, 8), (8, 0, 6)]
    return [
        (
            tuple((f"doc{i}", docs[f"doc{i}"]) for i in pick),
            f"Question {turn} about topics {pick}?",
            f"Answer {turn}: see doc{pick[0]}.",
        )
        for turn, pick in enumerate(picks)
    ]


def play_turns(
    url: str | None, conversation_id: str, turns: Sequence[TurnSpec]
) -> list[tuple[Messages, list[str]]]:
    """A fresh pilot on ``url`` (memory when None) plays ``turns``: each turn's
    prompt messages and the ids it de-duplicated."""
    pilot = ContextPilot(store=url)
    played = []
    for blocks, query, answer in turns:
        prompt = pilot.optimize(
            [ContextBlock(text, id=block_id) for block_id, text in blocks],
            query,
            conversation_id=conversation_id,
        )
        pilot.record_answer(prompt, answer)
        played.append(([dict(m) for m in prompt.messages], [b.id for b in prompt.deduplicated]))
    return played


def race_turns(url: str, conversation_id: str, tag: str, threads: int, turns: int) -> list[str]:
    """Threads on two pilots append ``turns`` turns each to one conversation and answer
    them; the queries of every turn that succeeded (a conflict is retried)."""
    pilots = [ContextPilot(store=url), ContextPilot(store=url)]
    done: list[str] = []
    lock = threading.Lock()

    def append(thread: int) -> None:
        pilot = pilots[thread % len(pilots)]
        for number in range(turns):
            query = f"{tag}-{thread}-{number}"
            blocks = [
                ContextBlock(f"Shared document {number % 3}. " * 8, id=f"shared{number % 3}"),
                ContextBlock(f"Own document of {query}. " * 8, id=f"own-{query}"),
            ]
            optimize = functools.partial(pilot.optimize, conversation_id=conversation_id)
            prompt = _retrying(functools.partial(optimize, blocks, query))
            _retrying(functools.partial(pilot.record_answer, prompt, f"answer {query}"))
            with lock:
                done.append(query)

    workers = [threading.Thread(target=append, args=(thread,)) for thread in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return done


def _retrying(call: Callable[[], Any]) -> Any:
    for _ in range(20):
        try:
            return call()
        except ConversationConflictError:
            continue
    raise AssertionError("a conflict persisted through 20 calls")


def _child(
    number: int,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    barrier: Any,
    results: Any,
) -> None:
    try:
        barrier.wait(120)
        results.put((number, function(*args), None))
    except BaseException as exc:
        results.put((number, None, repr(exc)))


def in_processes(calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
    """Run each ``function(*args)`` in a new process, all starting together; their
    results in order."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(len(calls))
    processes = [
        context.Process(target=_child, args=(number, function, args, barrier, results))
        for number, (function, args) in enumerate(calls)
    ]
    for process in processes:
        process.start()
    try:
        got = [results.get(timeout=300) for _ in calls]
    finally:
        for process in processes:
            process.join(30)
    errors = [error for _, _, error in got if error is not None]
    assert errors == []
    return [value for _, value in sorted((number, value) for number, value, _ in got)]


def in_process(function: Callable[..., Any], *args: Any) -> Any:
    return in_processes([(function, args)])[0]


# -- one conformance suite for every store -------------------------------------------------


@dataclass
class StoreCase:
    make: Callable[..., VersionedConversationStore]
    expire: Callable[[], None]  # let more than the TTL pass
    tick: Callable[[], None]  # let the store's clock move (LRU order)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCase]:
    clock = FakeClock()

    def advance(seconds: float) -> Callable[[], None]:
        def move() -> None:
            clock.now += seconds

        return move

    opened: list[Any] = []
    if request.param == "memory":

        def make_memory(max_conversations: int = 100) -> VersionedConversationStore:
            return InMemoryConversationStore(
                max_conversations=max_conversations, ttl_s=30.0, clock=clock
            )

        yield StoreCase(make_memory, advance(31), advance(1))
    elif request.param == "sqlite":

        def make_sqlite(max_conversations: int = 100) -> VersionedConversationStore:
            store = SQLiteConversationStore(
                tmp_path / "store.db", max_conversations=max_conversations, ttl_s=30, clock=clock
            )
            opened.append(store)
            return store

        yield StoreCase(make_sqlite, advance(31), advance(1))
    else:
        url = request.getfixturevalue("redis_url")

        def make_redis(max_conversations: int = 100) -> VersionedConversationStore:
            store = RedisConversationStore(url, ttl_s=0.5, max_conversations=max_conversations)
            opened.append(store)
            return store

        yield StoreCase(make_redis, lambda: time.sleep(0.7), lambda: time.sleep(0.005))
    for store in opened:
        store.close()


def a_conversation(conversation_id: str = "conv", turns: int = 2) -> Conversation:
    conversation = Conversation(conversation_id, "Système: réponds en français ✓")
    for number in range(turns):
        conversation = conversation.with_turn(
            Turn(
                request_id=f"cp-{number:09d}",
                user_message=f"Context documents:\n\n[d{number}] text ✓\n\nQuestion: q{number}",
                block_ids=(f"d{number}", "d-shared"),
                block_digests=(f"digest{number}", "digest-shared"),
                block_labels=(f"d{number}", "d-shared"),
                block_tokens=(12, 7),
                question=f"q{number}",
                tail_tokens=5,
            )
        )
    return conversation.with_answer("the first answer", 3, request_id="cp-000000000")


def test_a_stored_conversation_reads_back_equal(case: StoreCase) -> None:
    store = case.make()
    conversation = a_conversation()
    store.put(conversation)
    assert store.get("conv") == conversation
    assert store.get_versioned("conv").conversation == conversation
    assert len(store) == 1


def test_an_unknown_id_is_absent_and_not_forgotten(case: StoreCase) -> None:
    store = case.make()
    assert store.get_versioned("nobody") == StoredConversation(None, 0, False)
    assert store.get("nobody") is None and not store.forgotten("nobody")


def test_a_write_from_a_stale_version_is_refused(case: StoreCase) -> None:
    store = case.make()
    assert store.put_if_version(a_conversation(turns=1), 0)
    assert not store.put_if_version(a_conversation(turns=1), 0)  # someone holds it now
    read = store.get_versioned("conv")
    assert store.put_if_version(a_conversation(turns=2), read.version)
    assert not store.put_if_version(a_conversation(turns=3), read.version)  # stale
    assert store.get("conv") == a_conversation(turns=2)
    assert store.get_versioned("conv").version > read.version


def test_a_version_is_never_reused_after_a_delete(case: StoreCase) -> None:
    store = case.make()
    store.put(a_conversation(turns=1))
    read = store.get_versioned("conv")
    assert store.delete("conv")
    store.put(a_conversation(turns=1))
    assert store.get_versioned("conv").version != read.version
    assert not store.put_if_version(a_conversation(turns=2), read.version)


def test_put_writes_whatever_the_version(case: StoreCase) -> None:
    store = case.make()
    store.put(a_conversation(turns=1))
    store.put(a_conversation(turns=2))
    assert store.get("conv") == a_conversation(turns=2)


def test_an_idle_conversation_expires_and_is_reported_forgotten(case: StoreCase) -> None:
    store = case.make()
    store.put(a_conversation())
    case.expire()
    assert store.get_versioned("conv") == StoredConversation(None, 0, True)
    assert store.forgotten("conv") and len(store) == 0
    assert not store.put_if_version(a_conversation(), 1)  # the read version is gone
    store.put(a_conversation())  # the id starts again
    assert not store.forgotten("conv") and store.get("conv") == a_conversation()


def test_the_least_recently_used_conversation_is_dropped_beyond_the_bound(
    case: StoreCase,
) -> None:
    store = case.make(max_conversations=2)
    for name in ("old", "new"):
        store.put(a_conversation(name))
        case.tick()
    store.get("old")  # now the most recently used
    case.tick()
    store.put(a_conversation("newest"))
    assert store.get("new") is None and store.forgotten("new")
    assert store.get("old") == a_conversation("old") and len(store) == 2


def test_delete_forgets_without_reporting_a_loss(case: StoreCase) -> None:
    store = case.make()
    store.put(a_conversation())
    assert store.delete("conv") and not store.delete("conv")
    assert store.get("conv") is None and not store.forgotten("conv")


# -- serialization ---------------------------------------------------------------------------


def test_the_stored_form_keeps_every_field() -> None:
    conversation = a_conversation(turns=3)
    data = encode_conversation(conversation)
    assert decode_conversation(data, "conv") == conversation
    assert b'"format":1' in data and "✓".encode() in data  # versioned, compact UTF-8


def test_the_stored_form_keeps_the_cache_key_and_reads_records_without_one() -> None:
    keyed = replace(a_conversation(turns=2), cache_key="cpk-" + "0" * 32)
    assert decode_conversation(encode_conversation(keyed), "conv") == keyed
    plain = a_conversation(turns=2)
    data = encode_conversation(plain)
    assert b"cache_key" not in data  # what earlier versions wrote, and still read
    assert decode_conversation(data, "conv").cache_key is None


def test_the_stored_form_keeps_the_dropped_turns_and_reads_records_without_them() -> None:
    windowed = replace(a_conversation(turns=2), dropped_turns=40)
    assert decode_conversation(encode_conversation(windowed), "conv") == windowed
    data = encode_conversation(a_conversation(turns=2))
    assert b"dropped" not in data  # what earlier versions wrote, and still read
    assert decode_conversation(data, "conv").dropped_turns == 0


@pytest.mark.parametrize(
    "data",
    [
        b'{"format":1,"id":"conv","system":null,"turns":[],"cache_key":7}',
        b'{"format":2,"id":"conv","system":null,"turns":[]}',
        b'{"format":1,"id":"other","system":null,"turns":[]}',
        b'{"format":1,"id":"conv","system":null,"turns":[["cp-1"]]}',
        b'{"format":1,"id":"conv","system":null,"turns":[],"dropped":-1}',
        b"not json",
    ],
    ids=["bad-cache-key", "newer-format", "another-id", "damaged-turn", "bad-dropped", "not-json"],
)
def test_an_unreadable_record_is_a_format_error(data: bytes) -> None:
    with pytest.raises(StoreFormatError):
        decode_conversation(data, "conv")


def test_a_sqlite_file_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    SQLiteConversationStore(tmp_path / "store.db").close()
    with sqlite3.connect(tmp_path / "store.db") as db:
        db.execute("UPDATE cp_meta SET value = 99 WHERE key = 'schema'")
    with pytest.raises(StoreFormatError, match="schema 99"):
        SQLiteConversationStore(tmp_path / "store.db")


# -- URLs and the store= contract --------------------------------------------------------------


def test_store_urls_name_their_backend(tmp_path: Path) -> None:
    redis = parse_store_url("redis://:secret@localhost:6380/2?key_prefix=app:&timeout_s=0.5")
    assert (redis.backend, redis.target) == ("redis", "redis://:secret@localhost:6380/2")
    assert redis.options == {"key_prefix": "app:", "timeout_s": "0.5"}
    assert parse_store_url("rediss://cache.internal").backend == "redis"
    absolute = parse_store_url(f"sqlite:///{tmp_path}/conversations.db")
    assert (absolute.backend, absolute.target) == ("sqlite", f"{tmp_path}/conversations.db")
    assert parse_store_url("sqlite:///relative.db").target == "relative.db"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "memory://",
        "postgres://localhost/db",
        "redis://",
        "redis://:6379/0",
        "redis://localhost:99999/0",
        "redis://localhost:0/0",
        "redis://localhost:port/0",
        "redis://localhost:6379/zero",
        "redis://localhost:6379/0?db=1",
        "redis://localhost:6379/0?timeout_s=-1",
        "redis://localhost:6379/0?key_prefix=",
        "redis://localhost:6379/0#fragment",
        "sqlite://host/conversations.db",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite:////no/such/directory/conversations.db",
        "sqlite:///conversations.db?busy_timeout_s=0",
        "sqlite:///conversations.db?journal=off",
    ],
)
def test_a_bad_store_url_is_a_config_error_before_anything_exists(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        ContextPilot(store=url)
    assert list(tmp_path.iterdir()) == []  # no database file was created


@pytest.mark.parametrize(
    "url",
    [
        "redis://:St0rePw@localhost:0/0",
        "redis://app:St0rePw@localhost:99999/0",
        "rediss://:St0rePw@localhost:6379/zero",
        "redis://:St0rePw@localhost:6379/0?db=1",
        "redis://:St0rePw@localhost:6379/0?timeout_s=-1",
        "redis://:St0rePw@localhost:6379/0#fragment",
        "redis://:St0re/Pw@localhost:6379/0",  # unencoded: the "/" ends the host
        "redis://:St0re#Pw@localhost:6379/0",
        "redis://:St0rePw@/0",
        "redis://localhost:6379/0?password=St0rePw",
        "redis://localhost:6379/0?St0rePw",
        "postgres://app:St0rePw@localhost/db",
    ],
)
def test_a_bad_store_url_is_refused_without_showing_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextPilot(store=url)
    assert "localhost" in str(caught.value) or "***@/0" in str(caught.value)
    assert "St0re" not in str(caught.value) and "Pw" not in str(caught.value)


def test_a_parsed_store_url_shows_no_password() -> None:
    parsed = parse_store_url("redis://app:St0rePw@localhost:6380/2?timeout_s=0.5")
    assert "St0rePw" in parsed.target  # what the client connects with ...
    assert "St0rePw" not in repr(parsed)  # ... is not what a log shows
    assert repr(parsed).startswith("StoreURL(backend='redis', target='redis://***@localhost")


def test_a_new_sqlite_store_file_is_private_to_its_owner(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # the usual default: new files readable by all
    try:
        pilot = ContextPilot(store=f"sqlite:///{tmp_path}/conversations.db")
        document = ContextBlock("a private document", id="d")
        prompt = pilot.optimize([document], "a private question", conversation_id="c")
        pilot.record_answer(prompt, "a private answer")
        SQLiteRouteStore(tmp_path / "routes.db").close()
    finally:
        os.umask(old_umask)
    files = sorted(tmp_path.iterdir())
    assert {f.name for f in files} >= {"conversations.db", "conversations.db-wal", "routes.db"}
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o600 for f in files}


def test_an_existing_sqlite_store_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    path.touch(mode=0o640)
    path.chmod(0o640)  # the operator's choice (a group of readers)
    SQLiteConversationStore(path).close()
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_store_of_the_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="store must be"):
        ContextPilot(store=42)  # type: ignore[arg-type]


def test_open_store_applies_the_bounds(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/s.db", max_conversations=1, ttl_s=None)
    assert isinstance(store, SQLiteConversationStore)
    store.put(a_conversation("a"))
    store.put(a_conversation("b"))
    assert len(store) == 1 and store.forgotten("a")
    store.close()


def test_the_redis_store_names_its_extra_when_redis_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` now fails
    with pytest.raises(ImportError, match=r"contextpilot-rag\[redis\]"):
        ContextPilot(store="redis://localhost:6379/0")


def test_a_store_without_versions_still_serves_one_pilot() -> None:
    class DictStore:
        def __init__(self) -> None:
            self.records: dict[str, Conversation] = {}

        def get(self, conversation_id: str) -> Conversation | None:
            return self.records.get(conversation_id)

        def put(self, conversation: Conversation) -> None:
            self.records[conversation.conversation_id] = conversation

        def delete(self, conversation_id: str) -> bool:
            return self.records.pop(conversation_id, None) is not None

        def forgotten(self, conversation_id: str) -> bool:
            return False

        def __len__(self) -> int:
            return len(self.records)

    turns = conversation_turns()[:3]
    pilot = ContextPilot(store=DictStore())
    played = []
    for blocks, query, answer in turns:
        prompt = pilot.optimize(
            [ContextBlock(t, id=i) for i, t in blocks], query, conversation_id="c"
        )
        pilot.record_answer(prompt, answer)
        played.append(([dict(m) for m in prompt.messages], [b.id for b in prompt.deduplicated]))
    assert played == play_turns(None, "c", turns)


def test_pilots_on_a_shared_store_never_mint_the_same_request_id(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    first, second = ContextPilot(store=url), ContextPilot(store=url)
    blocks = [ContextBlock("a document")]
    one = first.optimize(blocks, "q", conversation_id="c")
    two = second.optimize(blocks, "q", conversation_id="c")
    assert one.request_id != two.request_id
    assert ContextPilot().optimize(blocks, "q").request_id == "cp-000000001"  # memory: as before


# -- compare-and-set in the pilot ------------------------------------------------------------


class InterferingStore(InMemoryConversationStore):
    """A real in-memory store that runs ``before_write`` just before each of the
    first ``times`` conditional writes: another writer getting in first."""

    def __init__(self, times: int = 1) -> None:
        super().__init__()
        self.times = times
        self.before_write: Callable[[], object] = lambda: None
        self.conditional_writes = 0

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        self.conditional_writes += 1
        if self.times > 0:
            self.times -= 1
            self.before_write()
        return super().put_if_version(conversation, expected_version)


def test_a_turn_planned_from_a_stale_record_is_planned_again() -> None:
    store = InterferingStore()
    mine, theirs = ContextPilot(store=store), ContextPilot(store=store)
    doc = ContextBlock("A document both turns carry. " * 5, id="shared")
    store.before_write = lambda: theirs.optimize([doc], "their question", conversation_id="c")
    prompt = mine.optimize([doc], "my question", conversation_id="c")
    stored = store.get("c")
    assert stored is not None
    assert [turn.question for turn in stored.turns] == ["their question", "my question"]
    assert prompt.deduplicated == (doc,)  # re-planned: their turn already carries it
    # their turn, still without its answer, then mine
    assert "their question" in prompt.messages[-3]["content"]
    assert prompt.messages[-2] == {"role": "assistant", "content": "(no answer)"}


def test_a_conflict_through_every_attempt_is_a_typed_error_and_changes_nothing() -> None:
    store = InterferingStore(times=0)
    pilot = ContextPilot(store=store)
    pilot.optimize([ContextBlock("first document")], "first", conversation_id="c")
    before, record = pilot.index_stats(), store.get("c")
    store.times = 10_000
    store.before_write = lambda: store.put(store.get("c") or Conversation("c", None))
    with pytest.raises(ConversationConflictError):
        pilot.optimize([ContextBlock("second document")], "second", conversation_id="c")
    assert pilot.index_stats() == before and store.get("c") == record


class LostReplyStore(InMemoryConversationStore):
    """A real in-memory store whose first conditional write is applied but reported
    as a conflict: what a retried write whose first reply was lost looks like."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next_reply = True

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        written = super().put_if_version(conversation, expected_version)
        if self.lose_next_reply:
            self.lose_next_reply = False
            return False
        return written


def test_a_write_applied_without_its_reply_is_not_repeated() -> None:
    store = LostReplyStore()
    pilot = ContextPilot(store=store)
    prompt = pilot.optimize([ContextBlock("a document")], "q", conversation_id="c")
    store.lose_next_reply = True
    pilot.record_answer(prompt, "the answer")
    stored = store.get("c")
    assert stored is not None and len(stored.turns) == 1
    assert stored.turns[0].request_id == prompt.request_id
    assert stored.turns[0].answer == "the answer"


class UnreachableForStore(InMemoryConversationStore):
    """A real in-memory store that times out writing conversation ``down``."""

    def __init__(self, down: str) -> None:
        super().__init__()
        self.down = down

    def put_if_version(self, conversation: Conversation, expected_version: int) -> bool:
        if conversation.conversation_id == self.down:
            raise StoreUnavailableError("the store timed out")
        return super().put_if_version(conversation, expected_version)


def test_an_answer_given_by_conversation_id_alone_can_be_retried() -> None:
    """The first write is applied but its reply is lost (a timeout): the retry of the
    same answer, by conversation id alone, changes nothing and succeeds."""
    store = LostReplyStore()
    pilot = ContextPilot(store=store)
    pilot.optimize([ContextBlock("a document")], "q", conversation_id="c")
    store.lose_next_reply = True
    pilot.record_answer("c", "the answer")  # applied, reported as a conflict: re-read
    pilot.record_answer("c", "the answer")  # the caller's retry
    stored = store.get("c")
    assert stored is not None and [t.answer for t in stored.turns] == ["the answer"]
    with pytest.raises(ConversationStateError):  # another text is still refused
        pilot.record_answer("c", "another answer")


def test_a_batch_whose_store_fails_midway_takes_back_the_turns_it_wrote() -> None:
    store = UnreachableForStore(down="b")
    pilot = ContextPilot(store=store)
    earlier = pilot.optimize([ContextBlock("doc zero")], "q0", conversation_id="a")
    pilot.record_answer(earlier, "a0")
    before, record = pilot.index_stats(), store.get("a")
    batch = [([ContextBlock("doc one")], "q1", "a"), ([ContextBlock("doc two")], "q2", "b")]
    with pytest.raises(StoreUnavailableError):
        pilot.optimize_batch(batch)
    assert store.get("a") == record and pilot.index_stats() == before
    follow_up = pilot.optimize([ContextBlock("doc three")], "q3", conversation_id="a")
    assert [m["role"] for m in follow_up.messages] == ["system", "user", "assistant", "user"]


def test_a_failed_batch_gives_back_the_turns_its_history_window_dropped() -> None:
    """With a history window the batch's write of ``a`` drops its oldest turn; when
    ``b`` then fails, ``a`` is the record it was (its turns, its turn numbers), and
    ``c``, new in the batch, is no record at all."""
    store = UnreachableForStore(down="b")
    pilot = ContextPilot(PilotConfig(max_history_turns=2), store=store)
    for number in range(2):
        prompt = pilot.optimize([ContextBlock(f"doc {number}")], f"q{number}", conversation_id="a")
        pilot.record_answer(prompt, f"a{number}")
    record = store.get("a")
    assert record is not None and (len(record.turns), record.dropped_turns) == (2, 0)
    batch = [
        ([ContextBlock("doc two")], "q2", "a"),
        ([ContextBlock("doc three")], "q3", "c"),
        ([ContextBlock("doc four")], "q4", "b"),
    ]
    with pytest.raises(StoreUnavailableError):
        pilot.optimize_batch(batch)
    assert store.get("a") == record
    assert store.get("c") is None and not store.forgotten("c")
    with pytest.raises(UnknownConversationError):
        pilot.conversation("c")


def test_a_batch_turn_is_written_to_a_shared_store(tmp_path: Path) -> None:
    pilot = ContextPilot(store=f"sqlite:///{tmp_path}/s.db")
    prompts = pilot.optimize_batch(
        [BatchRequest([ContextBlock("doc a")], "q1", "conv"), ([ContextBlock("doc b")], "q2")]
    )
    assert len(prompts) == 2
    reader = ContextPilot(store=f"sqlite:///{tmp_path}/s.db")
    assert [turn.question for turn in reader.conversation("conv").turns] == ["q1"]


# -- several processes on one store ------------------------------------------------------------


def test_a_conversation_continued_in_another_process_deduplicates_as_in_one(
    redis_url: str,
) -> None:
    turns = conversation_turns()
    expected = play_turns(None, "conv", turns)
    started = in_process(play_turns, redis_url, "conv", turns[:3])
    continued = in_process(play_turns, redis_url, "conv", turns[3:])
    assert started + continued == expected
    assert any(deduplicated for _, deduplicated in continued)  # B points at A's turns


def test_no_recorded_turn_is_lost_when_the_processes_and_redis_restart(
    persistent_redis: Any,
) -> None:
    url = persistent_redis.url()
    turns = conversation_turns()
    played = in_process(play_turns, url, "conv", turns[:2])
    played += in_process(play_turns, url, "conv", turns[2:4])
    persistent_redis.kill()
    persistent_redis.start()
    played += in_process(play_turns, url, "conv", turns[4:])
    assert played == play_turns(None, "conv", turns)
    stored = RedisConversationStore(url).get("conv")
    assert stored is not None
    assert [turn.answer for turn in stored.turns] == [answer for _, _, answer in turns]


def test_sqlite_serves_several_processes_and_outlives_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/conversations.db"
    turns = conversation_turns()
    played = in_process(play_turns, url, "conv", turns[:2])
    played += in_process(play_turns, url, "conv", turns[2:4])
    played += in_process(play_turns, url, "conv", turns[4:])  # a restart: a new process
    assert played == play_turns(None, "conv", turns)


def open_new_stores(directory: str, count: int) -> int:
    """Open ``count`` new SQLite stores in turn, one file each, as a worker does at
    start-up; returns how many opened."""
    for number in range(count):
        open_store(f"sqlite:///{directory}/fresh-{number}.db").close()
    return count


def test_processes_opening_a_new_sqlite_store_together_all_open_it(tmp_path: Path) -> None:
    # the processes contend for the lock that switches a new file to WAL, which SQLite
    # refuses at once rather than after the busy timeout: each waits its turn instead
    opened = in_processes([(open_new_stores, (str(tmp_path), 10)) for _ in range(4)])
    assert opened == [10] * 4


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_racing_threads_and_processes_lose_and_duplicate_no_turn(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
    else:
        # six writers on a loaded two-core machine can hold the lock past the default
        # 5 s; what this test checks is that no turn is lost or doubled, not the wait
        url = f"sqlite:///{tmp_path}/race.db?busy_timeout_s=60"
    threads, turns = 3, 4
    done = in_processes([(race_turns, (url, "race", tag, threads, turns)) for tag in ("a", "b")])
    queries = sorted(query for process in done for query in process)
    assert len(queries) == 2 * threads * turns
    reader = ContextPilot(store=url)
    stored = reader.conversation("race").turns
    assert sorted(turn.question for turn in stored) == queries  # none lost, none twice
    assert len({turn.request_id for turn in stored}) == len(stored)
    assert all(turn.answer == f"answer {turn.question}" for turn in stored)  # paired right


# -- TTL and failures ------------------------------------------------------------------------


def test_an_expired_redis_conversation_is_reported_lost(redis_url: str) -> None:
    pilot = ContextPilot(PilotConfig(conversation_ttl_s=0.3), store=redis_url)
    doc = [ContextBlock("a document")]
    prompt = pilot.optimize(doc, "q1", conversation_id="c")
    time.sleep(0.5)
    with pytest.raises(ConversationExpiredError):
        pilot.record_answer(prompt, "too late")
    assert pilot.optimize(doc, "q2", conversation_id="c").history_lost


def test_with_redis_down_calls_fail_fast_and_nothing_recorded_is_lost(
    persistent_redis: Any,
) -> None:
    turns = conversation_turns()
    blocks = [[ContextBlock(text, id=block_id) for block_id, text in spec] for spec, _, _ in turns]
    pilot = ContextPilot(store=persistent_redis.url())
    first = pilot.optimize(blocks[0], turns[0][1], conversation_id="conv")
    pilot.record_answer(first, turns[0][2])
    second = pilot.optimize(blocks[1], turns[1][1], conversation_id="conv")
    index_before = pilot.index_stats()
    persistent_redis.kill()
    for call in (
        lambda: pilot.optimize(blocks[2], turns[2][1], conversation_id="conv"),
        lambda: pilot.record_answer(second, turns[1][2]),
        lambda: pilot.conversation("conv"),
    ):
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            call()
        assert time.monotonic() - started < 3.0
    assert pilot.index_stats() == index_before  # the failed calls changed nothing here
    persistent_redis.start()
    assert [turn.answer for turn in pilot.conversation("conv").turns] == [turns[0][2], None]
    pilot.record_answer(second, turns[1][2])
    third = pilot.optimize(blocks[2], turns[2][1], conversation_id="conv")
    expected = play_turns(None, "conv", turns[:3])
    assert [dict(m) for m in third.messages] == expected[2][0]


def test_a_hung_redis_fails_the_call_within_its_timeout(redis_server: Any) -> None:
    redis_server.flush()
    pilot = ContextPilot(store=f"{redis_server.url()}?timeout_s=0.5")
    pilot.optimize([ContextBlock("a document")], "q1", conversation_id="c")
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            pilot.optimize([ContextBlock("a document")], "q2", conversation_id="c")
        assert time.monotonic() - started < 2.5
    finally:
        redis_server.resume()
    assert pilot.conversation("c").turns[0].question == "q1"


def test_a_locked_sqlite_file_fails_the_call_within_its_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteConversationStore(path, busy_timeout_s=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            store.put(a_conversation())
        assert time.monotonic() - started < 2.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.put(a_conversation())
    assert store.get("conv") == a_conversation()
    store.close()


@pytest.mark.parametrize("case", ["sqlite", "redis"], indirect=True)  # shared stores
def test_a_record_changed_by_another_writer_is_read_again_not_taken_from_the_cache(
    case: StoreCase,
) -> None:
    mine, theirs = case.make(), case.make()
    mine.put(a_conversation(turns=1))
    assert mine.get("conv") == a_conversation(turns=1)  # now held decoded by `mine`
    theirs.put(a_conversation(turns=3))
    assert mine.get("conv") == a_conversation(turns=3)
    assert theirs.delete("conv") and mine.get("conv") is None
