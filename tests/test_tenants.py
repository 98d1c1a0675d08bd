"""Tenants (docs/tenants.md): one pilot, several customers, nothing of one in another's
prompts; the engine's prefix cache (the loopback engine, salted like vLLM) shares only
what is marked shared."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt
from contextpilot_rag.errors import (
    BlockConflictError,
    ConfigError,
    InvalidBlockError,
    InvalidInputError,
    UnknownConversationError,
)
from contextpilot_rag.index import IndexConfig
from contextpilot_rag.routing import Endpoint, RoutingClient
from contextpilot_rag.routing.metrics import DECISION_LOGGER
from contextpilot_rag.routing.prompt_keys import PromptKeys, serialise
from contextpilot_rag.serve import BackgroundServer, ServeConfig
from contextpilot_rag.tenants import SaltDeriver, SaltPolicy, TenantConfig, conversation_key
from contextpilot_rag.testing import OpenAICompatibleServer

KEY = "tenant-salt-key-for-tests"
MODEL = "test-model"


def pilot_of(policy: SaltPolicy = "private", **options: Any) -> ContextPilot:
    tenants = TenantConfig(cache_salt=policy, salt_key=KEY, **options)
    return ContextPilot(PilotConfig(tenants=tenants))


def doc(tenant: str, number: int, *, block_id: str | None = None) -> ContextBlock:
    """A private document of ``tenant``; its text names the tenant (so a leak shows),
    its id is the same for every tenant unless given."""
    text = f"{tenant} keeps private record {number}: " + f"{tenant}-{number} " * 12
    return ContextBlock(text, id=block_id or f"doc{number}")


def public(number: int) -> ContextBlock:
    text = f"Public handbook page {number}: " + f"chapter {number} " * 12
    return ContextBlock(text, id=f"pub{number}", shared=True)


def content(prompt: Prompt) -> str:
    return "\n".join(message["content"] for message in prompt.messages)


# -- non-interference: a tenant's prompts are those of a pilot that saw only it -------


@dataclass
class Workload:
    """Random requests of several tenants, interleaved; documents with the same ids
    (and different texts) for every tenant, conversations with the same ids."""

    tenants: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)

    @classmethod
    def random(cls, seed: int, steps: int = 24) -> Workload:
        rng = random.Random(seed)
        tenants = tuple(f"tenant-{n}" for n in range(rng.randint(2, 4)))
        workload = cls(tenants)
        for number in range(steps):
            numbers = rng.sample(range(8), rng.randint(1, 5))
            conversation = rng.choice([None, None, "c1", "c2"])
            answered = rng.random() < 0.7
            workload.steps.append(
                Step(rng.choice(tenants), numbers, conversation, answered, number)
            )
        return workload


@dataclass(frozen=True)
class Step:
    tenant: str
    documents: list[int]
    conversation: str | None
    answered: bool
    number: int


def play(pilot: ContextPilot, steps: list[Step]) -> list[Prompt]:
    prompts = []
    for step in steps:
        blocks = [doc(step.tenant, n) for n in step.documents]
        prompt = pilot.optimize(
            blocks,
            f"question {step.number}?",
            conversation_id=step.conversation,
            tenant=step.tenant,
        )
        if step.conversation is not None and step.answered:
            pilot.record_answer(prompt, f"answer {step.number}")
        prompts.append(prompt)
    return prompts


def seen(prompt: Prompt) -> tuple[object, ...]:
    """Everything of a prompt a tenant sees, its (random) request id aside."""
    return (
        prompt.messages,
        [block.id for block in prompt.blocks],
        prompt.stats,
        prompt.labels,
        prompt.order_note,
        prompt.location_note,
        prompt.cache_salt,
        prompt.history_lost,
    )


@pytest.mark.parametrize("policy", ["private", "always", "never"])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_tenants_prompts_are_those_of_a_pilot_that_saw_only_it(
    policy: SaltPolicy, seed: int
) -> None:
    workload = Workload.random(seed)
    mixed = play(pilot_of(policy), workload.steps)
    for tenant in workload.tenants:
        own_steps = [step for step in workload.steps if step.tenant == tenant]
        alone = play(pilot_of(policy), own_steps)
        steps = zip(mixed, workload.steps, strict=True)
        together = [prompt for prompt, step in steps if step.tenant == tenant]
        assert [seen(p) for p in together] == [seen(p) for p in alone]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_no_private_block_of_another_tenant_reaches_a_prompt_even_with_shared_blocks(
    seed: int,
) -> None:
    rng = random.Random(seed)
    tenants = [f"t{n}" for n in range(3)]
    pilot = pilot_of(rng.choice(["private", "always", "never"]))
    sent: dict[str, set[str]] = {tenant: set() for tenant in tenants}
    for number in range(30):
        tenant = rng.choice(tenants)
        blocks = [doc(tenant, n) for n in rng.sample(range(6), rng.randint(0, 3))]
        blocks += [public(n) for n in rng.sample(range(4), rng.randint(0 if blocks else 1, 3))]
        rng.shuffle(blocks)
        conversation = rng.choice([None, "c1"])
        prompt = pilot.optimize(blocks, f"q{number}", conversation_id=conversation, tenant=tenant)
        text = content(prompt)
        for other in tenants:
            if other != tenant:
                assert f"{other} keeps private" not in text
                assert f"{other}-" not in text
        # a private block reported cached was sent by this tenant before
        matched = [block for block in prompt.blocks[: prompt.stats.blocks_matched]]
        assert {block.text for block in matched if not block.shared} <= sent[tenant]
        sent[tenant].update(block.text for block in prompt.blocks)
        if prompt.conversation_id is not None:
            pilot.record_answer(prompt, "ok")


def test_the_same_blocks_of_another_tenant_are_no_match() -> None:
    pilot = pilot_of()
    blocks = [doc("acme", n) for n in range(4)]
    pilot.optimize(blocks, "first", tenant="acme")
    again = pilot.optimize(blocks[::-1], "second", tenant="acme")
    other = pilot.optimize(blocks[::-1], "second", tenant="globex")
    assert again.stats.blocks_matched == 4
    assert other.stats.blocks_matched == 0 and other.stats.reusable_tokens == 0
    assert [b.id for b in other.blocks] == [b.id for b in blocks[::-1]]  # not acme's order


def test_a_block_id_reused_by_another_tenant_is_no_conflict_and_no_popularity() -> None:
    pilot = pilot_of()
    for number in range(3):
        pilot.optimize([doc("acme", 1), doc("acme", 2)], f"q{number}", tenant="acme")
    # same ids, other texts: acme's registrations are neither a conflict nor counted
    prompt = pilot.optimize([doc("globex", 2), doc("globex", 1)], "q", tenant="globex")
    assert [b.id for b in prompt.blocks] == ["doc2", "doc1"]
    assert prompt.order_note is None


def test_a_batch_takes_one_id_with_other_texts_from_other_tenants_as_online() -> None:
    pilot = pilot_of()
    batch = [
        ([doc("acme", 1)], "q", None, "acme"),
        ([doc("globex", 1)], "q", None, "globex"),
        ([doc("nobody", 1)], "q"),
    ]
    prompts = sorted(pilot.optimize_batch(batch), key=lambda prompt: prompt.index)
    assert [prompt.blocks[0].text for prompt in prompts] == [
        doc("acme", 1).text,
        doc("globex", 1).text,
        doc("nobody", 1).text,
    ]
    with pytest.raises(BlockConflictError):  # within one tenant it is still a conflict
        pilot.optimize_batch([([doc("acme", 1)], "q", None, "acme"),
                              ([doc("globex", 1)], "r", None, "acme")])  # fmt: skip


def test_requests_without_a_tenant_and_with_one_do_not_meet() -> None:
    pilot = pilot_of()
    blocks = [doc("acme", n) for n in range(3)]
    pilot.optimize(blocks, "q")
    assert pilot.optimize(blocks[::-1], "q", tenant="acme").stats.blocks_matched == 0
    pilot.optimize(blocks, "q2", tenant="globex")
    assert pilot.optimize(blocks[::-1], "q3").stats.blocks_matched == 3  # its own, untenanted


# -- shared blocks -----------------------------------------------------------------


def test_a_miss_on_a_prompt_held_only_in_the_shared_index_evicts_only_its_prefix() -> None:
    """With no salt and its tenant's index dropped (``max_tenants``), a prompt is left
    only in the shared index, by its leading shared blocks: a cache miss evicts what
    shares them, not every prompt under the system prompt."""
    pilot = pilot_of("never", max_tenants=1)
    pilot.optimize([public(1), doc("acme", 1)], "a1", tenant="acme")
    second = pilot.optimize([public(1), doc("acme", 1)], "a2", tenant="acme")
    assert second.stats.blocks_matched == 2
    others = [pilot.optimize([public(2), doc("globex", 1)], f"g{n}", tenant="globex")
              for n in range(3)]  # fmt: skip
    assert pilot.observe_cache(second, 0, second.stats.prompt_tokens) == 1  # a1 only
    again = pilot.optimize([public(2), doc("globex", 1)], "g3", tenant="globex")
    assert all(other.request_id in pilot._shared_index for other in others)
    assert again.stats.blocks_matched == 2


def test_shared_blocks_match_across_tenants_in_one_order() -> None:
    pilot = pilot_of()
    first = pilot.optimize([public(1), public(2), public(3)], "q", tenant="acme")
    second = pilot.optimize([public(3), public(1), public(2)], "q", tenant="globex")
    assert first.cache_salt is None and second.cache_salt is None  # public prompts
    assert [b.id for b in second.blocks] == [b.id for b in first.blocks]
    assert second.stats.blocks_matched == 3
    assert second.messages[:-1] == first.messages[:-1]
    end = first.boundaries[-1].char_end  # the same bytes up to the last block
    assert second.messages[-1]["content"][:end] == first.messages[-1]["content"][:end]


def test_shared_blocks_come_first_and_private_ones_start_the_tenants_part() -> None:
    pilot = pilot_of("never")
    pilot.optimize([public(1), public(2), doc("acme", 1)], "q", tenant="acme")
    prompt = pilot.optimize([doc("globex", 7), public(2), public(1)], "q", tenant="globex")
    assert [b.shared for b in prompt.blocks] == [True, True, False]
    assert prompt.stats.blocks_matched == 2  # acme's shared prefix, not its private block
    assert prompt.cache_salt is None


def test_a_prompt_with_a_private_block_is_salted_by_default() -> None:
    pilot = pilot_of()
    pilot.optimize([public(1), public(2)], "q", tenant="acme")
    prompt = pilot.optimize([public(1), public(2), doc("globex", 1)], "q", tenant="globex")
    assert prompt.cache_salt is not None
    assert prompt.stats.blocks_matched == 0  # salted: another cache namespace


@pytest.mark.parametrize(
    ("policy", "blocks", "conversation", "system", "salted"),
    [
        ("private", "shared", None, None, False),
        ("private", "mixed", None, None, True),
        ("private", "shared", "c1", None, True),
        ("private", "shared", None, "Answer as acme's agent.", True),
        ("always", "shared", None, None, True),
        ("never", "mixed", "c1", "Answer as acme's agent.", False),
    ],
)
def test_which_prompts_carry_the_salt(
    policy: SaltPolicy, blocks: str, conversation: str | None, system: str | None, salted: bool
) -> None:
    pilot = pilot_of(policy)
    given = [public(1)] + ([doc("acme", 1)] if blocks == "mixed" else [])
    prompt = pilot.optimize(given, "q", tenant="acme", conversation_id=conversation, system=system)
    assert (prompt.cache_salt is not None) is salted
    assert prompt.request_extras() == ({"cache_salt": prompt.cache_salt} if salted else {})


def test_a_system_prompt_declared_shared_keeps_public_prompts_unsalted() -> None:
    pilot = pilot_of(shared_system_prompts=("You answer from the handbook.",))
    prompt = pilot.optimize([public(1)], "q", tenant="acme", system="You answer from the handbook.")
    assert prompt.cache_salt is None


def test_shared_changes_nothing_without_a_tenant() -> None:
    plain = [ContextBlock(b.text, id=b.id) for b in (public(1), public(2))]
    one, other = ContextPilot(), ContextPilot()
    for number in range(3):
        a = one.optimize([public(2), public(1)], f"q{number}")
        b = other.optimize(plain[::-1], f"q{number}")
        assert seen(a) == seen(b)


def test_shared_must_be_a_bool() -> None:
    with pytest.raises(InvalidBlockError, match="shared"):
        ContextBlock("text", shared="yes")  # type: ignore[arg-type]


# -- cache_salt --------------------------------------------------------------------


def test_the_salt_differs_per_tenant_is_stable_and_hides_the_name() -> None:
    salts = SaltDeriver(KEY)
    acme, globex = salts.salt("acme"), salts.salt("globex")
    assert acme != globex
    assert SaltDeriver(KEY).salt("acme") == acme  # another pilot, the same key
    assert SaltDeriver("another-key-of-16-chars").salt("acme") != acme
    assert "acme" not in acme and acme.startswith("cps-") and len(acme) == 36
    pilot = pilot_of("always")
    assert pilot.optimize([doc("acme", 1)], "q", tenant="acme").cache_salt == acme


def test_without_a_key_salts_are_per_pilot() -> None:
    one = ContextPilot(PilotConfig(tenants=TenantConfig(cache_salt="always")))
    two = ContextPilot(PilotConfig(tenants=TenantConfig(cache_salt="always")))
    first = one.optimize([doc("acme", 1)], "q", tenant="acme").cache_salt
    assert first == one.optimize([doc("acme", 2)], "q", tenant="acme").cache_salt
    assert first != two.optimize([doc("acme", 1)], "q", tenant="acme").cache_salt


@pytest.mark.parametrize(
    "options",
    [
        {"max_tenants": 0},
        {"cache_salt": "sometimes"},
        {"salt_key": "short"},
        {"shared_system_prompts": "one prompt"},
    ],
)
def test_a_bad_tenant_configuration_is_a_config_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        TenantConfig(**options)


# -- validation: typed errors, nothing changed -------------------------------------


BAD_TENANTS = ["", "x" * 257, 7, b"acme", "bad\ud800"]


def state(pilot: ContextPilot) -> tuple[object, ...]:
    return (
        pilot.index_stats(),
        pilot.index_stats(tenant="acme"),
        len(pilot._registry),
        len(pilot._store),
        len(pilot._tenant_indexes),
        pilot._shared_index.stats(),
    )


@pytest.mark.parametrize("tenant", BAD_TENANTS)
def test_a_bad_tenant_is_refused_before_anything_changes(tenant: Any) -> None:
    pilot = pilot_of()
    prompt = pilot.optimize([doc("acme", 1)], "q", tenant="acme", conversation_id="c")
    before = state(pilot)
    blocks = [doc("acme", 2), public(1)]
    calls: list[Callable[[], object]] = [
        lambda: pilot.optimize(blocks, "q", tenant=tenant),
        lambda: pilot.optimize(blocks, "q", tenant=tenant, conversation_id="c"),
        lambda: pilot.optimize_batch([(blocks, "q"), (blocks, "q2", None, tenant)]),
        lambda: pilot.record_answer("c", "answer", tenant=tenant),
        lambda: pilot.record_answer(prompt, "answer", tenant=tenant),
        lambda: pilot.observe_cache(prompt.request_id, 0, 10, tenant=tenant),
        lambda: pilot.conversation("c", tenant=tenant),
        lambda: pilot.end_conversation("c", tenant=tenant),
        lambda: pilot.index_stats(tenant=tenant),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError):
            call()
        assert state(pilot) == before
    assert pilot.conversation("c", tenant="acme").turns[0].answer is None


def test_a_tenants_conversation_key_is_refused_as_a_plain_id() -> None:
    pilot = pilot_of()
    pilot.optimize([doc("acme", 1)], "q", tenant="acme", conversation_id="c")
    forged = conversation_key("acme", "c")
    calls: list[Callable[[], object]] = [
        lambda: pilot.optimize([doc("x", 1)], "q", conversation_id=forged),
        lambda: pilot.record_answer(forged, "stolen"),
        lambda: pilot.conversation(forged),
        lambda: pilot.optimize_batch([([doc("x", 1)], "q", forged)]),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError, match="reserved prefix"):
            call()
    assert pilot.conversation("c", tenant="acme").turns[0].answer is None


def test_a_prompt_answers_only_under_its_own_tenant() -> None:
    pilot = pilot_of()
    prompt = pilot.optimize([doc("acme", 1)], "q", tenant="acme", conversation_id="c")
    with pytest.raises(InvalidInputError, match="another tenant"):
        pilot.record_answer(prompt, "answer", tenant="globex")
    pilot.record_answer(prompt, "answer")
    assert pilot.conversation("c", tenant="acme").turns[0].answer == "answer"


def test_a_tenants_request_id_is_unknown_to_other_tenants() -> None:
    pilot = pilot_of()
    blocks = [doc("acme", n) for n in range(3)]
    pilot.optimize(blocks, "q", tenant="acme")
    prompt = pilot.optimize(blocks, "q2", tenant="acme")
    usage = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 0}}
    for tenant in (None, "globex"):
        with pytest.raises(InvalidInputError, match="no recent prompt"):
            pilot.observe(prompt.request_id, usage, tenant=tenant)
    assert pilot.observe(prompt.request_id, usage, tenant="acme") == 1  # the first one
    assert pilot.index_stats(tenant="acme").requests == 1


def test_request_ids_of_tenants_do_not_count_requests() -> None:
    pilot = pilot_of()
    ids = [pilot.optimize([doc("acme", n)], "q", tenant="acme").request_id for n in range(3)]
    assert len(set(ids)) == 3
    assert pilot.optimize([doc("x", 1)], "q").request_id == "cp-000000001"  # untenanted


# -- conversations -----------------------------------------------------------------


def test_a_conversation_id_under_another_tenant_is_another_conversation() -> None:
    pilot = pilot_of()
    first = pilot.optimize([doc("acme", 1)], "q1", tenant="acme", conversation_id="c")
    pilot.record_answer(first, "acme's answer")
    other = pilot.optimize([doc("acme", 1)], "q1", tenant="globex", conversation_id="c")
    assert other.stats.blocks_deduplicated == 0 and len(other.messages) == 2
    assert "acme's answer" not in content(other)
    plain = pilot.optimize([doc("acme", 1)], "q1", conversation_id="c")
    assert plain.stats.blocks_deduplicated == 0 and len(plain.messages) == 2
    with pytest.raises(UnknownConversationError):
        pilot.record_answer("c", "x", tenant="nobody")
    second = pilot.optimize([doc("acme", 1)], "q2", tenant="acme", conversation_id="c")
    assert second.stats.blocks_deduplicated == 1 and second.location_note is not None
    assert pilot.conversation("c", tenant="acme").conversation_id == "c"
    assert pilot.end_conversation("c", tenant="globex")
    assert len(pilot.conversation("c", tenant="acme").turns) == 2


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_stored_conversation_keeps_its_tenant_across_pilots(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'tenants.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    config = PilotConfig(tenants=TenantConfig(salt_key=KEY))
    first_process, second_process = ContextPilot(config, store=url), ContextPilot(config, store=url)
    blocks = [doc("acme", 1), doc("acme", 2)]
    turn = first_process.optimize(blocks, "q1", tenant="acme", conversation_id="chat")
    first_process.record_answer(turn, "acme's answer")
    again = second_process.optimize(blocks, "q2", tenant="acme", conversation_id="chat")
    assert again.stats.blocks_deduplicated == 2 and "acme's answer" in content(again)
    assert again.cache_salt == turn.cache_salt
    second_process.record_answer("chat", "second answer", tenant="acme")
    for tenant in ("globex", None):
        stranger = second_process.optimize(blocks, "q", tenant=tenant, conversation_id="chat")
        assert stranger.stats.blocks_deduplicated == 0
        assert "acme's answer" not in content(stranger)
    stored = ContextPilot(config, store=url).conversation("chat", tenant="acme")
    assert [t.answer for t in stored.turns] == ["acme's answer", "second answer"]


# -- batches, eviction, bounds -----------------------------------------------------


def test_a_batch_keeps_tenants_apart() -> None:
    pilot = pilot_of()
    blocks = [doc("acme", n) for n in range(3)]
    pilot.optimize(blocks, "q", tenant="acme")
    prompts = pilot.optimize_batch(
        [
            (blocks[::-1], "a", None, "acme"),
            (blocks[::-1], "b", None, "globex"),
            (blocks, "c", "chat", "acme"),
            (blocks, "d", "chat", "globex"),
            (blocks, "e"),
        ]
    )
    by_index = {p.index: p for p in prompts}
    assert by_index[0].stats.blocks_matched == 3 and by_index[0].tenant == "acme"
    assert by_index[1].stats.blocks_matched == 0 and by_index[1].tenant == "globex"
    assert by_index[1].cache_salt not in (None, by_index[0].cache_salt)
    assert pilot.conversation("chat", tenant="acme").turns[0].question == "c"
    assert pilot.conversation("chat", tenant="globex").turns[0].question == "d"
    assert by_index[4].tenant is None and by_index[4].stats.blocks_matched == 0


def test_evict_reaches_tenants_indexes() -> None:
    pilot = pilot_of("never")
    prompt = pilot.optimize([public(1), doc("acme", 1)], "q", tenant="acme")
    assert pilot.index_stats(tenant="acme").requests == 1
    assert pilot.evict([prompt.request_id]) == 1  # held in two indexes, counted once
    assert pilot.index_stats(tenant="acme").requests == 0
    assert pilot._shared_index.stats().requests == 0


def test_at_most_max_tenants_indexes_are_kept() -> None:
    pilot = pilot_of(max_tenants=2)
    for tenant in ("a", "b", "c"):
        pilot.optimize([doc(tenant, 1)], "q", tenant=tenant)
    assert pilot.index_stats(tenant="a").requests == 0  # the least recently used: dropped
    assert pilot.index_stats(tenant="c").requests == 1
    assert len(pilot._tenant_indexes) == 2


def test_unsalted_prompts_with_private_blocks_keep_the_shared_index_bounded() -> None:
    """With ``"never"`` a prompt's leading shared blocks enter the shared index; each
    request's own leaf there is what the node bound counts and drops."""
    tenants = TenantConfig(cache_salt="never", salt_key=KEY)
    pilot = ContextPilot(PilotConfig(tenants=tenants, index=IndexConfig(max_nodes=40)))
    for number in range(300):
        tenant = f"t{number % 3}"
        pilot.optimize([public(1), doc(tenant, number)], f"q{number}", tenant=tenant)
    stats = pilot._shared_index.stats()
    assert stats.requests <= stats.nodes <= 40
    other = pilot.optimize([public(1), doc("t9", 1)], "q", tenant="t9")
    assert other.blocks[0].id == "pub1" and other.stats.blocks_matched >= 1  # still shared


# -- the engine's cache: salted like vLLM ------------------------------------------


@pytest.fixture
def engine() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(model=MODEL) as server:
        yield server


def send(engine: OpenAICompatibleServer, prompt: Prompt) -> int:
    """Send ``prompt`` as a client does (with its salt); the engine's cached tokens."""
    body = {"model": MODEL, "messages": prompt.to_openai(), **prompt.request_extras()}
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=10)
    response.raise_for_status()
    cached: int = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


def test_the_loopback_engine_separates_salts(engine: OpenAICompatibleServer) -> None:
    messages = [{"role": "user", "content": "A long shared prompt. " * 40}]

    def cached(**extra: Any) -> int:
        body = {"model": MODEL, "messages": messages, **extra}
        response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=10)
        return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(cache_salt="a") == 0
    assert cached(cache_salt="a") > 0
    assert cached(cache_salt="b") == 0
    assert cached() == 0
    assert cached() > 0
    assert cached(cache_salt="a") > 0


@pytest.mark.parametrize("salt", ["", 5, "x" * 129, "run/1", "a@b", "a\\b", "a\x00b"])
def test_the_loopback_engine_refuses_a_bad_salt(
    engine: OpenAICompatibleServer, salt: object
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "cache_salt": salt}
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=10)
    assert response.status_code == 400 and "cache_salt" in response.text
    assert engine.requests == []


def test_another_tenant_gets_no_cached_token_of_a_private_prefix(
    engine: OpenAICompatibleServer,
) -> None:
    pilot = pilot_of()
    blocks = [doc("acme", n) for n in range(4)]
    assert send(engine, pilot.optimize(blocks, "q", tenant="acme")) == 0
    assert send(engine, pilot.optimize(blocks, "q", tenant="acme")) > 0
    # globex holds the very same documents (it knows them) and still hits nothing
    assert send(engine, pilot.optimize(blocks, "q", tenant="globex")) == 0
    assert send(engine, pilot.optimize(blocks, "q", tenant="globex")) > 0


def test_without_salts_the_engine_would_share_the_private_prefix(
    engine: OpenAICompatibleServer,
) -> None:
    pilot = pilot_of("never")  # what the salt prevents, shown on the same engine
    blocks = [doc("acme", n) for n in range(4)]
    send(engine, pilot.optimize(blocks, "q", tenant="acme"))
    assert send(engine, pilot.optimize(blocks, "q", tenant="globex")) > 0


def test_shared_blocks_hit_the_engine_cache_across_tenants(
    engine: OpenAICompatibleServer,
) -> None:
    pilot = pilot_of()
    first = pilot.optimize([public(n) for n in range(4)], "q1", tenant="acme")
    assert send(engine, first) == 0
    second = pilot.optimize([public(n) for n in (3, 1, 0, 2)], "q2", tenant="globex")
    end = second.boundaries[-1].char_end  # the end of the shared blocks
    cached = send(engine, second)
    assert cached > 0.8 * pilot.tokenizer.count(second.messages[-1]["content"][:end])


def test_with_never_another_tenant_hits_only_the_shared_part(
    engine: OpenAICompatibleServer,
) -> None:
    pilot = pilot_of("never")
    shared = [public(n) for n in range(3)]
    send(engine, pilot.optimize([*shared, doc("acme", 1), doc("acme", 2)], "q", tenant="acme"))
    prompt = pilot.optimize([doc("globex", 1), *shared[::-1]], "q", tenant="globex")
    assert prompt.stats.blocks_matched == 3
    system, user = prompt.messages
    last_shared = prompt.boundaries[2].char_end
    encode = pilot.tokenizer.encode
    shared_tokens = len(encode(f"<|system|>\n{system['content']}\n")) + len(
        encode(f"<|user|>\n{user['content'][:last_shared]}")
    )
    assert 0 < send(engine, prompt) <= shared_tokens + 1


def test_the_routing_client_sends_the_salt_as_a_parameter(
    engine: OpenAICompatibleServer,
) -> None:
    pilot = pilot_of()
    prompt = pilot.optimize([doc("acme", 1)], "q", tenant="acme")
    with RoutingClient([engine.base_url], model=MODEL) as client:
        client.chat(prompt, **prompt.request_extras())
    assert engine.requests[0]["cache_salt"] == prompt.cache_salt


# -- the routing client: the salt reaches the engine, routes are per salt -----------


@pytest.fixture
def fleet() -> Iterator[list[OpenAICompatibleServer]]:
    with ExitStack() as stack:
        yield [stack.enter_context(OpenAICompatibleServer(model=MODEL)) for _ in range(3)]


def urls(fleet: list[OpenAICompatibleServer]) -> list[str]:
    return [server.base_url for server in fleet]


def test_the_routing_client_sends_a_salted_prompts_salt_by_itself(
    engine: OpenAICompatibleServer,
) -> None:
    pilot = pilot_of()
    salted = pilot.optimize([doc("acme", 1)], "q", tenant="acme")
    unsalted = [
        pilot.optimize([doc("acme", 1)], "q"),  # no tenant
        pilot.optimize([public(1)], "q", tenant="acme"),  # a public prompt
    ]
    with RoutingClient([engine.base_url], model=MODEL) as client:
        client.chat(salted)
        client.complete(salted)
        for prompt in unsalted:
            client.chat(prompt)
        client.chat("plain text")
    bodies = engine.requests
    assert [body.get("cache_salt") for body in bodies[:2]] == [salted.cache_salt] * 2
    assert all("cache_salt" not in body for body in bodies[2:])


def test_the_cache_salt_parameter_overrides_the_prompts(engine: OpenAICompatibleServer) -> None:
    prompt = pilot_of().optimize([doc("acme", 1)], "q", tenant="acme")
    with RoutingClient([engine.base_url], model=MODEL) as client:
        client.chat(prompt, cache_salt="chosen-by-the-caller")
        client.chat(prompt, cache_salt=None)
        client.chat("plain text", cache_salt="for-plain-text")
        with pytest.raises(InvalidInputError, match="cache_salt"):
            client.chat(prompt, cache_salt="")
    assert [body.get("cache_salt") for body in engine.requests] == [
        "chosen-by-the-caller",
        None,
        "for-plain-text",
    ]


def test_send_cache_salt_keeps_the_field_from_servers_that_refuse_it(
    fleet: list[OpenAICompatibleServer],
) -> None:
    prompt = pilot_of().optimize([doc("acme", 1)], "q", tenant="acme")
    strict, vllm, default = fleet
    endpoints = [
        Endpoint(strict.base_url, send_cache_salt=False),
        Endpoint(vllm.base_url, send_cache_salt=True),
        Endpoint(default.base_url),
    ]
    for send in (True, False):
        with RoutingClient(
            endpoints, model=MODEL, policy="round-robin", send_cache_salt=send
        ) as client:
            for _ in fleet:
                client.chat(prompt)
    sent = [[body.get("cache_salt") for body in server.requests] for server in fleet]
    assert sent == [[None, None], [prompt.cache_salt] * 2, [prompt.cache_salt, None]]
    with pytest.raises(ConfigError, match="send_cache_salt"):
        Endpoint(strict.base_url, send_cache_salt="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="send_cache_salt"):
        RoutingClient(endpoints, model=MODEL, send_cache_salt=None)  # type: ignore[arg-type]


def test_another_tenants_request_follows_no_route_of_the_first_tenant(
    fleet: list[OpenAICompatibleServer],
) -> None:
    pilot = pilot_of()
    blocks = [doc("acme", n) for n in range(4)]  # globex sends the very same texts
    with RoutingClient(urls(fleet), model=MODEL) as client:
        acme = client.chat(pilot.optimize(blocks, "q1", tenant="acme"))
        acme_again = client.chat(pilot.optimize(blocks, "q2", tenant="acme"))
        globex = client.chat(pilot.optimize(blocks, "q1", tenant="globex"))
        globex_again = client.chat(pilot.optimize(blocks, "q2", tenant="globex"))
    # a tenant follows its own route to its own cache ...
    assert acme_again.endpoint == acme.endpoint
    assert acme_again.decision.predicted_cached_tokens > 0 and (acme_again.cached_tokens or 0) > 0
    # ... another one neither hits that cache nor is routed by it (its own route only)
    assert globex.cached_tokens == 0 and globex.decision.predicted_cached_tokens == 0
    assert globex_again.endpoint == globex.endpoint
    assert globex_again.decision.predicted_cached_tokens > 0
    assert (globex_again.cached_tokens or 0) > 0


def test_without_salts_the_other_tenant_would_follow_the_route(
    fleet: list[OpenAICompatibleServer],
) -> None:
    pilot = pilot_of("never")  # what the salt prevents, on the same fleet
    blocks = [doc("acme", n) for n in range(4)]
    with RoutingClient(urls(fleet), model=MODEL) as client:
        acme = client.chat(pilot.optimize(blocks, "q1", tenant="acme"))
        globex = client.chat(pilot.optimize(blocks, "q1", tenant="globex"))
    assert globex.endpoint == acme.endpoint and globex.decision.predicted_cached_tokens > 0
    assert all("cache_salt" not in body for server in fleet for body in server.requests)


def test_public_prompts_share_routes_and_cache_across_tenants(
    fleet: list[OpenAICompatibleServer],
) -> None:
    pilot = pilot_of()
    with RoutingClient(urls(fleet), model=MODEL) as client:
        acme = client.chat(pilot.optimize([public(n) for n in range(4)], "q1", tenant="acme"))
        globex = client.chat(
            pilot.optimize([public(n) for n in (3, 1, 0, 2)], "q2", tenant="globex")
        )
    assert globex.endpoint == acme.endpoint
    assert globex.decision.predicted_cached_tokens > 0 and (globex.cached_tokens or 0) > 0
    assert all("cache_salt" not in body for server in fleet for body in server.requests)


def test_route_keys_are_per_salt() -> None:
    prompt = pilot_of().optimize([doc("acme", n) for n in range(4)], "q", tenant="acme")
    keys, text = PromptKeys(), serialise(prompt)

    def hashes(salt: str | None) -> tuple[int, ...]:
        return keys.request(text, request_id="r", salt=salt).block_hashes

    acme = hashes("cps-acme")
    assert acme != hashes(None) and not set(acme) & set(hashes("cps-globex"))
    assert not set(acme) & set(hashes(None))
    request = keys.request(text, request_id="r", salt="cps-acme")
    assert [acme[b - 1] for b in request.boundaries] == [
        request.block_hashes[b - 1] for b in request.boundaries
    ]  # boundaries keep their keys for one salt (fillers are per request)


# -- the serve proxy ---------------------------------------------------------------


DOCUMENTS = [
    {"id": "paris", "text": ("Paris is the capital of France. " * 12).strip()},
    {"id": "berlin", "text": ("Berlin is the capital of Germany. " * 12).strip()},
]


@pytest.fixture
def proxy(engine: OpenAICompatibleServer) -> Iterator[BackgroundServer]:
    config = ServeConfig(endpoints=(engine.base_url,), model=MODEL, salt_key=KEY)
    with ExitStack() as stack:
        yield stack.enter_context(BackgroundServer(config))


def ask(proxy: BackgroundServer, tenant: str, documents: list[dict[str, Any]]) -> Any:
    with openai.OpenAI(base_url=proxy.base_url, api_key="-", max_retries=0) as client:
        return client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Which capital?"}],
            extra_body={"contextpilot": {"documents": documents, "tenant": tenant}},
        )


def test_the_proxy_salts_each_tenant_and_isolates_its_cache(
    proxy: BackgroundServer, engine: OpenAICompatibleServer
) -> None:
    ask(proxy, "acme", DOCUMENTS)
    again = ask(proxy, "acme", DOCUMENTS[::-1])
    other = ask(proxy, "globex", DOCUMENTS[::-1])
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.model_extra["contextpilot"]["blocks_matched"] == 2
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert other.model_extra["contextpilot"]["blocks_matched"] == 0
    salts = [body["cache_salt"] for body in engine.requests]
    assert salts[0] == salts[1] != salts[2]
    assert not any("acme" in salt or "globex" in salt for salt in salts)


def test_the_proxy_routes_each_tenant_by_its_own_routes_only(
    fleet: list[OpenAICompatibleServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=DECISION_LOGGER)
    config = ServeConfig(endpoints=tuple(urls(fleet)), model=MODEL, salt_key=KEY)
    public_documents = [{**document, "shared": True} for document in DOCUMENTS]
    requests: list[tuple[str, list[dict[str, Any]]]] = [
        ("acme", DOCUMENTS),
        ("acme", DOCUMENTS),
        ("globex", DOCUMENTS),  # the same texts: no route of acme's
        ("acme", public_documents),
        ("globex", public_documents),  # public: acme's route and cache
    ]
    with BackgroundServer(config) as server:
        for tenant, documents in requests:
            ask(server, tenant, documents)
    decisions = [vars(r)["routing"] for r in caplog.records if r.name == DECISION_LOGGER]
    predicted = [d["predicted_cached_tokens"] > 0 for d in decisions]
    served = [d["observed_cached_tokens"] > 0 for d in decisions]
    assert predicted == served == [False, True, False, False, True]
    assert decisions[1]["endpoint"] == decisions[0]["endpoint"]
    assert decisions[4]["endpoint"] == decisions[3]["endpoint"]
    salts = [body.get("cache_salt") for server in fleet for body in server.requests]
    assert sum(salt is not None for salt in salts) == 3


def test_the_proxy_shares_public_documents_unsalted(
    proxy: BackgroundServer, engine: OpenAICompatibleServer
) -> None:
    public_documents = [{**document, "shared": True} for document in DOCUMENTS]
    ask(proxy, "acme", public_documents)
    other = ask(proxy, "globex", public_documents[::-1])
    assert other.usage.prompt_tokens_details.cached_tokens > 0
    assert other.model_extra["contextpilot"]["blocks_matched"] == 2
    assert all("cache_salt" not in body for body in engine.requests)


def test_the_proxy_refuses_a_bad_shared_flag(proxy: BackgroundServer) -> None:
    with pytest.raises(openai.BadRequestError, match="shared"):
        ask(proxy, "acme", [{"text": "x", "shared": "yes"}])


def test_the_proxy_sends_no_salt_with_policy_never(engine: OpenAICompatibleServer) -> None:
    config = ServeConfig(endpoints=(engine.base_url,), model=MODEL, cache_salt="never")
    with BackgroundServer(config) as server:
        ask(server, "acme", DOCUMENTS)
    assert "cache_salt" not in engine.requests[0]


def test_a_bad_serve_salt_configuration_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        ServeConfig(endpoints=("http://127.0.0.1:1/v1",), model=MODEL, cache_salt="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ServeConfig(endpoints=("http://127.0.0.1:1/v1",), model=MODEL, salt_key="short")


def test_the_loopback_engine_takes_a_salt_of_vllms_longest(
    engine: OpenAICompatibleServer,
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "cache_salt": "x" * 128,
    }
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=10)
    assert response.status_code == 200
