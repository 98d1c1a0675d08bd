"""Tenants: one pilot serving several customers without mixing them.

A *tenant* is a name given with a request (``optimize(..., tenant="acme")``). The
pilot keeps each tenant's state apart (``docs/tenants.md``):

- **index**: every tenant has its own :class:`~contextpilot_rag.index.ContextIndex`
  (:class:`TenantIndexes`, an LRU of at most ``TenantConfig.max_tenants`` indexes, each
  bounded by ``TenantConfig.index``), so a prompt only ever matches its own tenant's
  earlier prompts;
- **conversations**: a conversation's store key includes its tenant
  (:func:`conversation_key`), so the same conversation id under another tenant is another
  conversation;
- **block registry and popularity**: a private block is registered under a key of its
  tenant (:func:`registry_key`), so an id reused by another tenant is neither a conflict
  nor counted there;
- **engine cache**: a prompt carries its tenant's ``cache_salt`` (:class:`SaltDeriver`,
  HMAC of the tenant under a secret key), which vLLM mixes into the first block's hash.

Blocks marked ``shared`` (public corpora) are the exception: they come first in a
tenant's prompt, in an order that does not depend on the tenant, and they may match the
shared prefixes of other tenants' prompts, held in one *shared index* keyed by content
(:func:`shared_key`). Whether a prompt is salted is :func:`salts`'s rule.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .blocks import ContextBlock, check_encodable
from .errors import ConfigError, InvalidInputError
from .index import ContextIndex, IndexConfig

__all__ = [
    "MAX_TENANT_CHARS",
    "SALT_KEY_ENV",
    "SHARED_KEY_PREFIX",
    "SaltDeriver",
    "SaltPolicy",
    "TenantConfig",
    "TenantIndexes",
    "check_tenant",
    "conversation_key",
    "is_tenant_key",
    "public_system",
    "registry_key",
    "salts",
    "shared_key",
]

SaltPolicy = Literal["private", "always", "never"]
"""When a tenant's prompt carries its ``cache_salt`` (see :func:`salts`)."""

MAX_TENANT_CHARS = 256
"""The longest tenant name accepted."""

SALT_KEY_ENV = "CONTEXTPILOT_SALT_KEY"
"""The environment variable ``contextpilot-rag serve`` and ``optimize`` read the salt
key from (the library itself never reads the environment)."""

_SALT_POLICIES: tuple[SaltPolicy, ...] = ("private", "always", "never")
_TENANT_KEY = "\x1ftenant:"  # starts every tenant's conversation key; refused as a plain id
_SALT_PREFIX = "cps-"
_SALT_HEX_CHARS = 32
_SALT_CACHE_SIZE = 4096
_MIN_SALT_KEY_CHARS = 16


def _default_tenant_index() -> IndexConfig:
    return IndexConfig(capacity_tokens=250_000, max_nodes=8_000)


@dataclass(frozen=True)
class TenantConfig:
    """How a :class:`~contextpilot_rag.ContextPilot` keeps tenants apart.

    ``max_tenants`` per-tenant context indexes are kept (least recently used dropped
    first: a dropped tenant's next prompt starts from an empty index), each bounded by
    ``index``; with the shared index (bounded by ``PilotConfig.index``) that bounds the
    tenants' index memory at ``max_tenants × index`` plus one ``PilotConfig.index``.

    ``cache_salt`` is the rule of :func:`salts`; ``salt_key`` the secret the salts are
    derived from (at least 16 characters; ``None``: a random key per pilot, so give every
    process that sends to one fleet the same key). ``shared_system_prompts`` are system
    prompts that count as public besides ``PilotConfig.system_prompt``: a prompt whose
    system prompt is another one is tenant-specific from its first token."""

    max_tenants: int = 256
    index: IndexConfig = field(default_factory=_default_tenant_index)
    cache_salt: SaltPolicy = "private"
    salt_key: str | None = field(default=None, repr=False)
    shared_system_prompts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        tenants = self.max_tenants
        if isinstance(tenants, bool) or not isinstance(tenants, int) or tenants < 1:
            raise ConfigError(f"TenantConfig.max_tenants must be an int >= 1, got {tenants!r}")
        if not isinstance(self.index, IndexConfig):
            raise ConfigError("TenantConfig.index must be an IndexConfig")
        if self.cache_salt not in _SALT_POLICIES:
            raise ConfigError(
                f"TenantConfig.cache_salt must be one of {_SALT_POLICIES}, got {self.cache_salt!r}"
            )
        key = self.salt_key
        if key is not None and (not isinstance(key, str) or len(key) < _MIN_SALT_KEY_CHARS):
            raise ConfigError(
                f"TenantConfig.salt_key must be a str of at least {_MIN_SALT_KEY_CHARS} "
                "characters, or None"
            )
        prompts = self.shared_system_prompts
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise ConfigError("TenantConfig.shared_system_prompts must be a tuple of str")
        object.__setattr__(self, "shared_system_prompts", tuple(prompts))


def check_tenant(tenant: object, name: str = "tenant") -> str:
    """``tenant`` if it is a valid tenant name: a non-empty str of at most
    :data:`MAX_TENANT_CHARS` characters, valid Unicode; else :class:`InvalidInputError`."""
    if not isinstance(tenant, str):
        raise InvalidInputError(f"{name} must be a str or None, got {type(tenant).__name__}")
    if not tenant or len(tenant) > MAX_TENANT_CHARS:
        raise InvalidInputError(
            f"{name} must be a non-empty str of at most {MAX_TENANT_CHARS} characters "
            f"(got {len(tenant)})"
        )
    check_encodable(name, tenant)
    return tenant


def conversation_key(tenant: str | None, conversation_id: str) -> str:
    """The id a conversation is stored under: ``conversation_id`` itself without a
    tenant, else a key naming both, unambiguously (no two ``(tenant, id)`` pairs share
    one, and no plain id is one: :func:`is_tenant_key`)."""
    if tenant is None:
        return conversation_id
    return f"{_TENANT_KEY}{len(tenant)}:{tenant}:{conversation_id}"


def is_tenant_key(conversation_id: str) -> bool:
    """Whether ``conversation_id`` has the form of a tenant's key (refused as the id of
    a conversation without a tenant, which could otherwise reach a tenant's record)."""
    return conversation_id.startswith(_TENANT_KEY)


SHARED_KEY_PREFIX = "\x00shared:"
"""How :func:`shared_key` keys start."""


def shared_key(block: ContextBlock) -> str:
    """The key of a shared block in the shared index and the block registry: its id
    *and* content, so that two tenants that give one id to different texts never meet
    (and neither can make the other's block an id conflict)."""
    return f"{SHARED_KEY_PREFIX}{block.digest}:{block.id}"


def registry_key(tenant: str, block: ContextBlock) -> str:
    """The key of one of ``tenant``'s blocks in the block registry: :func:`shared_key`
    for a shared block, a key of the tenant's own for a private one."""
    if block.shared:
        return shared_key(block)
    return f"\x00t{len(tenant)}:{tenant}:{block.id}"


def salts(
    policy: SaltPolicy,
    *,
    private_blocks: bool,
    conversation: bool,
    public_system: bool,
) -> bool:
    """Whether a tenant's prompt is sent with the tenant's ``cache_salt``.

    vLLM mixes the salt into the hash of the prompt's first cache block, so a salted
    prompt shares no cached block with any prompt of another salt, or with an unsalted
    one: salting is all or nothing per prompt. Hence:

    - ``"always"``: every tenant prompt is salted (no cross-tenant reuse, even of shared
      blocks);
    - ``"never"``: none is (for engines without ``cache_salt``; the pilot still keeps
      tenants apart, the engine's cache does not);
    - ``"private"`` (default): salted unless everything before the question is public —
      no private block (``private_blocks``), not a conversation (its history is the
      tenant's), and a public system prompt (``public_system``). Such a prompt goes
      unsalted, so that all tenants reuse one cached prefix of the shared blocks; its
      question is then as visible to a timing probe as on a single-tenant engine."""
    if policy == "always":
        return True
    if policy == "never":
        return False
    return private_blocks or conversation or not public_system


class SaltDeriver:
    """A tenant's ``cache_salt``: ``cps-`` and 32 hex digits of HMAC-SHA256 of the
    tenant under ``key``, so the salt is stable for one key and tells nothing about the
    tenant's name to whoever sees it (engine logs, the network)."""

    def __init__(self, key: str | None) -> None:
        self.random_key = key is None
        self._key = secrets.token_bytes(32) if key is None else key.encode("utf-8")
        self._salts: dict[str, str] = {}

    def salt(self, tenant: str) -> str:
        salt = self._salts.get(tenant)
        if salt is None:
            digest = hmac.new(self._key, tenant.encode("utf-8"), hashlib.sha256).hexdigest()
            salt = _SALT_PREFIX + digest[:_SALT_HEX_CHARS]
            if len(self._salts) >= _SALT_CACHE_SIZE:
                self._salts.clear()
            self._salts[tenant] = salt
        return salt


class TenantIndexes:
    """tenant → its :class:`ContextIndex`, at most ``max_tenants`` of them.

    Invariant: ``len(self) <= max_tenants``; the least recently used tenant's index is
    dropped when another is made. :meth:`peek` reads without making or refreshing
    (planning), :meth:`get` makes and refreshes (committing). Not thread-safe by
    itself: the pilot's lock guards it."""

    def __init__(
        self,
        config: IndexConfig,
        max_tenants: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._max = max_tenants
        self._clock = clock
        self._indexes: OrderedDict[str, ContextIndex] = OrderedDict()

    def __len__(self) -> int:
        return len(self._indexes)

    def __iter__(self) -> Iterator[ContextIndex]:
        return iter(list(self._indexes.values()))

    def peek(self, tenant: str) -> ContextIndex | None:
        return self._indexes.get(tenant)

    def get(self, tenant: str) -> ContextIndex:
        index = self._indexes.get(tenant)
        if index is None:
            index = self._indexes[tenant] = ContextIndex(self._config, clock=self._clock)
            while len(self._indexes) > self._max:
                self._indexes.popitem(last=False)
        else:
            self._indexes.move_to_end(tenant)
        return index


def public_system(system_text: str | None, config_prompt: str | None, extra: Sequence[str]) -> bool:
    """Whether a prompt's system prompt is public: none, the pilot's default, or one
    of ``TenantConfig.shared_system_prompts``."""
    return not system_text or system_text == config_prompt or system_text in extra
