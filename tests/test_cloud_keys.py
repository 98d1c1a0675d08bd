"""``prompt_cache_key`` (docs/cloud.md): requests that share a leading prefix share a
key, a conversation keeps one key for all its turns, a tenant's salted prompts never
share one with another tenant, and no key carries a secret or a user's text."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Tokenizer
from contextpilot_rag.cloud import OPENAI_RULES, CloudCacheConfig, ProviderRules
from contextpilot_rag.cloud.keys import KeyBuckets, bucket_key
from contextpilot_rag.errors import ConfigError
from contextpilot_rag.tenants import TenantConfig

PLANNED = CloudCacheConfig(enabled=True)


@pytest.fixture
def pilot(tokenizer: Tokenizer) -> ContextPilot:
    return ContextPilot(PilotConfig(cloud=PLANNED), tokenizer=tokenizer)


def _docs(*names: str) -> list[ContextBlock]:
    """Documents long enough that two of them pass the minimum cacheable prefix (a
    prompt under it is never reordered with planning on)."""
    return [
        ContextBlock(f"Document {n} about secret-{n}. " + "More facts. " * 250, id=n) for n in names
    ]


def test_requests_sharing_a_readable_prefix_share_a_key(pilot: ContextPilot) -> None:
    """The key names the leading blocks up to the minimum cacheable prefix (here the
    first two): requests that could read from each other share it, a request sharing
    only a shorter prefix (one block) gets another, so it does not crowd their route."""
    first = pilot.optimize(_docs("a", "b", "c"), "Q1?")
    second = pilot.optimize(_docs("d", "b", "a"), "Q2?")  # a, b reordered first
    shorter = pilot.optimize(_docs("x", "a"), "Q3?")  # a first, then x
    other = pilot.optimize(_docs("y", "z"), "Q4?")
    assert [block.id for block in second.blocks[:2]] == ["a", "b"]
    assert shorter.blocks[0].id == "a"
    assert first.prompt_cache_key == second.prompt_cache_key
    assert len({first.prompt_cache_key, shorter.prompt_cache_key, other.prompt_cache_key}) == 3


def test_key_blocks_fixes_the_number_of_leading_blocks(tokenizer: Tokenizer) -> None:
    cloud = CloudCacheConfig(enabled=True, key_blocks=1)
    pilot = ContextPilot(PilotConfig(cloud=cloud), tokenizer=tokenizer)
    first = pilot.optimize(_docs("a", "b"), "Q1?")
    second = pilot.optimize(_docs("c", "a"), "Q2?")  # a is reordered first
    other = pilot.optimize(_docs("x", "y"), "Q3?")
    assert second.blocks[0].id == "a"
    assert first.prompt_cache_key == second.prompt_cache_key != other.prompt_cache_key


def test_another_system_prompt_is_another_key(pilot: ContextPilot) -> None:
    first = pilot.optimize(_docs("a"), "Q?")
    second = pilot.optimize(_docs("a"), "Q?", system="Another assistant.")
    assert first.prompt_cache_key != second.prompt_cache_key


def test_a_conversation_keeps_its_first_turns_key(pilot: ContextPilot) -> None:
    """Later turns keep the key whatever they retrieve; another conversation that
    starts with the same block shares it (its prefix is the same), one that starts
    elsewhere does not."""
    keys = set()
    for turn, names in enumerate((("a", "b"), ("x",), ("b", "q"))):
        prompt = pilot.optimize(_docs(*names), f"Q{turn}?", conversation_id="conv-1")
        pilot.record_answer(prompt, f"A{turn}")
        keys.add(prompt.prompt_cache_key)
    alike = pilot.optimize(_docs("b", "a"), "Q?", conversation_id="conv-2")
    other = pilot.optimize(_docs("x", "y"), "Q?", conversation_id="conv-3")
    assert len(keys) == 1 and alike.prompt_cache_key in keys
    assert other.prompt_cache_key not in keys


def _busy_pilot(tokenizer: Tokenizer, clock: Clock, store: str | None = None) -> ContextPilot:
    rules = replace(OPENAI_RULES, key_rate_per_minute=2)
    cloud = CloudCacheConfig(enabled=True, rules=rules, key_rate_share=1.0, key_blocks=1)
    return ContextPilot(PilotConfig(cloud=cloud), tokenizer=tokenizer, clock=clock, store=store)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_busy_route_sends_new_requests_under_another_key(tokenizer: Tokenizer) -> None:
    clock = Clock()
    pilot = _busy_pilot(tokenizer, clock)
    first = [pilot.optimize(_docs("a", f"d{n}"), f"Q{n}?").prompt_cache_key for n in range(5)]
    assert first[0] == first[1] != first[2] == first[3] != first[4]  # two a minute per key
    assert len(set(first)) == 3 and all(key and key.startswith("cpk-") for key in first)
    clock.now += 61.0  # the first route's minute is over
    assert pilot.optimize(_docs("a"), "Q?").prompt_cache_key == first[0]


def test_a_conversation_keeps_its_key_when_its_route_gets_busy(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """The key is stored with the conversation: the third conversation, put under a
    variant of the busy key, keeps the variant on later turns, also in another pilot
    (process) sharing the store, which never saw the route busy."""
    clock = Clock()
    store = f"sqlite:///{tmp_path / 'conversations.db'}"
    pilot = _busy_pilot(tokenizer, clock, store)
    prompts = []
    for number in range(3):
        prompt = pilot.optimize(_docs("a", "b"), f"Q{number}?", conversation_id=f"c{number}")
        pilot.record_answer(prompt, "A.")
        prompts.append(prompt)
    keys = [prompt.prompt_cache_key for prompt in prompts]
    assert keys[0] == keys[1] != keys[2]
    clock.now += 120.0
    again = _busy_pilot(tokenizer, clock, store)
    later = again.optimize(_docs("z"), "Next?", conversation_id="c2")
    assert later.prompt_cache_key == keys[2]


def test_keys_are_digests_of_no_user_text(pilot: ContextPilot) -> None:
    prompt = pilot.optimize(_docs("a"), "my password is hunter2", conversation_id="alice@x")
    key = prompt.prompt_cache_key
    assert key is not None and key.startswith("cpk-") and len(key) == 36
    for text in ("hunter2", "alice", "secret", "Document"):
        assert text not in key


def test_salted_tenants_never_share_a_key(tokenizer: Tokenizer) -> None:
    config = PilotConfig(tenants=TenantConfig(salt_key="k" * 32), cloud=PLANNED)
    pilot = ContextPilot(config, tokenizer=tokenizer)
    first = pilot.optimize(_docs("a"), "Q?", tenant="t1")
    again = pilot.optimize(_docs("a"), "Q2?", tenant="t1")
    other = pilot.optimize(_docs("a"), "Q?", tenant="t2")
    assert first.cache_salt is not None
    assert first.prompt_cache_key == again.prompt_cache_key != other.prompt_cache_key
    convs = [
        pilot.optimize(_docs("a"), "Q?", conversation_id="same", tenant=tenant)
        for tenant in ("t1", "t2")
    ]
    assert convs[0].prompt_cache_key != convs[1].prompt_cache_key


def test_the_key_is_stable_across_pilots(tokenizer: Tokenizer) -> None:
    """Pilots in several processes give the same requests the same key."""
    keys = {
        ContextPilot(PilotConfig(cloud=PLANNED), tokenizer=tokenizer)
        .optimize(_docs("a", "b"), "Q?")
        .prompt_cache_key
        for _ in range(2)
    }
    assert len(keys) == 1


def test_key_buckets_count_a_bounded_number_of_keys() -> None:
    buckets = KeyBuckets(1.5, max_keys=2)
    buckets.record("k", 0.0)
    assert buckets.choose("k", 1.0) == "k"  # one request: under the rate of 1.5
    buckets.record("k", 1.0)
    assert buckets.choose("k", 2.0) == bucket_key("k", 1) != "k"
    assert buckets.choose("k", 61.5) == "k"  # the first request left the minute
    buckets.record("x", 3.0)
    buckets.record("y", 3.0)  # the third key: "k", least recently used, is dropped
    assert buckets.choose("k", 4.0) == "k"
    unlimited = KeyBuckets(None, max_keys=1)
    for _ in range(3):
        unlimited.record("k", 0.0)
    assert unlimited.choose("k", 0.0) == "k"


@pytest.mark.parametrize(
    "make",
    [
        lambda: KeyBuckets(0, max_keys=1),
        lambda: KeyBuckets(1, max_keys=0),
        lambda: ProviderRules("p", key_rate_per_minute=0),
        lambda: ProviderRules("p", key_rate_per_minute=True),
        lambda: CloudCacheConfig(key_rate_share=0),
        lambda: CloudCacheConfig(key_rate_share=1.5),
        lambda: CloudCacheConfig(key_blocks=0),
        lambda: CloudCacheConfig(key_blocks=True),
        lambda: CloudCacheConfig(next_turn_probability="0.5"),  # type: ignore[arg-type]
        lambda: CloudCacheConfig(next_turn_probability=float("nan")),
    ],
    ids=[
        "rate-0",
        "no-keys",
        "rules-rate-0",
        "rules-rate-bool",
        "share-0",
        "share-above-1",
        "key-blocks-0",
        "key-blocks-bool",
        "next-turn-str",
        "next-turn-nan",
    ],
)
def test_bad_key_settings_are_refused(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


def test_key_buckets_keep_room_for_the_next_turns_of_open_conversations() -> None:
    """Two requests under a rate of 3: room for a third when nothing else is expected,
    none when both come from conversations sure to send their next turn."""
    quiet = KeyBuckets(3, max_keys=8)
    quiet.record("k", 0.0)
    quiet.record("k", 0.0)
    assert quiet.choose("k", 1.0) == "k"
    busy = KeyBuckets(3, max_keys=8)
    for conversation in ("c1", "c2"):
        busy.record("k", 0.0, conversation=conversation, returns=1.0, until=60.0)
    assert busy.choose("k", 1.0) == bucket_key("k", 1)
    # c1's next turn arrives and is its last: counted once, as a request
    busy.record("k", 10.0, conversation="c1", returns=0.0)
    assert busy.choose("k", 11.0) == bucket_key("k", 1)  # 3 requests + c2 expected
    # the first two requests left the minute and c2 is overdue: only c1's turn is left
    assert busy.choose("k", 61.0) == "k"


def test_key_buckets_bound_the_open_conversations() -> None:
    buckets = KeyBuckets(2.5, max_keys=2)
    for number in range(3):  # the third drops the least recently seen conversation
        buckets.record(f"k{number}", 0.0, conversation=number, returns=1.0, until=60.0)
    assert buckets.choose("k0", 1.0) == "k0"  # its request left the counted keys too
    assert buckets.choose("k2", 1.0) == "k2"  # 1 request + 1 expected < 2.5
    buckets.record("k2", 2.0)
    assert buckets.choose("k2", 3.0) == bucket_key("k2", 1)


def test_key_buckets_refuse_a_bad_expectation_before_counting() -> None:
    buckets = KeyBuckets(2, max_keys=4)
    buckets.record("k", 0.0)
    with pytest.raises(ConfigError, match="returns"):
        buckets.record("k", 0.0, conversation="c", returns=1.5, until=60.0)
    assert buckets.choose("k", 1.0) == "k"  # still one request, nothing expected


def test_dense_conversations_keep_reading_their_history_on_openai(tokenizer: Tokenizer) -> None:
    """Conversations starting half a second apart, replayed through the emulated OpenAI
    cache: later turns stay on the server that holds their previous turn (counting only
    the last minute let routes fill with new conversations whose later turns overflowed
    them a minute later: a fifth of the later turns missed)."""
    from array import array

    from contextpilot_rag.bench.cloud_suite import _pilot_config, _prompts
    from contextpilot_rag.bench.cloud_workloads import multiturn_family
    from contextpilot_rag.sim.provider_cache import OpenAICacheModel

    workload = multiturn_family(7, conversations=40, session_gap_s=0.5)
    cache = OpenAICacheModel()
    previous: dict[str, list[int]] = {}
    missed = later = 0
    for prompt, timed in _prompts(workload, _pilot_config("openai", "gpt-5.4"), tokenizer):
        ids: array[int] = array("i")
        for message in prompt.to_openai():
            ids.extend(tokenizer.encode(f"<|{message['role']}|>\n{message['content']}"))
        usage = cache.request(ids, now_s=timed.at_s, prompt_cache_key=prompt.prompt_cache_key)
        before = previous.get(timed.user)
        if before is not None:
            pairs = enumerate(zip(ids, before, strict=False))
            shared = next((i for i, (a, b) in pairs if a != b), min(len(ids), len(before)))
            readable = shared // 128 * 128
            later += 1
            missed += readable >= 1024 and usage.cached_tokens < readable
        previous[timed.user] = list(ids)
    # a few misses while the chance of a next turn is still being learnt (28 before)
    assert later > 80 and missed <= later // 20


def test_a_system_prompt_worth_caching_on_its_own_is_the_key(tokenizer: Tokenizer) -> None:
    """With a system prompt above the minimum cacheable prefix, requests that share only
    it share a key (one server holds it); with a short one the leading block tells them
    apart."""
    for system, shared in (("Rules. " * 1200, True), ("Be brief.", False)):
        config = PilotConfig(system_prompt=system, cloud=CloudCacheConfig(enabled=True))
        pilot = ContextPilot(config, tokenizer=tokenizer)
        keys = {pilot.optimize(_docs(name), "Q?").prompt_cache_key for name in ("a", "x")}
        assert (len(keys) == 1) is shared
