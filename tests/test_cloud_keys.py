"""``prompt_cache_key`` (docs/cloud.md): requests that share a leading prefix share a
key, a conversation keeps one key for all its turns, a tenant's salted prompts never
share one with another tenant, and no key carries a secret or a user's text."""

from __future__ import annotations

import pytest

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Tokenizer
from contextpilot_rag.cloud import CloudCacheConfig
from contextpilot_rag.tenants import TenantConfig

PLANNED = CloudCacheConfig(enabled=True)


@pytest.fixture
def pilot(tokenizer: Tokenizer) -> ContextPilot:
    return ContextPilot(PilotConfig(cloud=PLANNED), tokenizer=tokenizer)


def _docs(*names: str) -> list[ContextBlock]:
    return [ContextBlock(f"Document {n} about secret-{n}.", id=n) for n in names]


def test_requests_sharing_their_leading_block_share_a_key(pilot: ContextPilot) -> None:
    first = pilot.optimize(_docs("a", "b"), "Q1?")
    second = pilot.optimize(_docs("c", "a"), "Q2?")  # a is reordered first
    other = pilot.optimize(_docs("x", "y"), "Q3?")
    assert second.blocks[0].id == "a"
    assert first.prompt_cache_key == second.prompt_cache_key != other.prompt_cache_key


def test_another_system_prompt_is_another_key(pilot: ContextPilot) -> None:
    first = pilot.optimize(_docs("a"), "Q?")
    second = pilot.optimize(_docs("a"), "Q?", system="Another assistant.")
    assert first.prompt_cache_key != second.prompt_cache_key


def test_a_conversation_keeps_one_key(pilot: ContextPilot) -> None:
    keys = set()
    for turn, names in enumerate((("a", "b"), ("x",), ("b", "q"))):
        prompt = pilot.optimize(_docs(*names), f"Q{turn}?", conversation_id="conv-1")
        pilot.record_answer(prompt, f"A{turn}")
        keys.add(prompt.prompt_cache_key)
    other = pilot.optimize(_docs("a", "b"), "Q?", conversation_id="conv-2")
    assert len(keys) == 1 and other.prompt_cache_key not in keys


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
