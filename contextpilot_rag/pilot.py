"""The :class:`ContextPilot` facade: one call turns retrieved blocks into a prompt
that reuses what the engine has cached.

``optimize`` works in two phases. *Plan* validates the input and computes the whole
prompt from the current state without changing it; *commit* then records the
request in the block registry, the context index and the conversation. Every error
is raised during planning, so a failed call leaves all state exactly as it was. One
lock serialises the calls, so concurrent callers see a consistent index.

The conversation is written first, and only if its record is still at the version the
plan read (compare-and-set, :class:`~contextpilot_rag.conversations.VersionedConversationStore`):
when another process (or another pilot on the same store) wrote the conversation in
between, the plan is stale, nothing is committed, and the turn is planned again from
the new record, up to :data:`STORE_ATTEMPTS` times with a short random back-off, then
:class:`~contextpilot_rag.errors.ConversationConflictError`. So several processes on one
store lose and duplicate no turn (``docs/stores.md``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import operator
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Generic, Literal, NamedTuple, TypeVar

from ._numbers import is_int, is_number
from .annotations import NoteTemplates, location_note, order_note
from .batch import BatchMethod, BatchSchedule, no_progress, plan_batch
from .batch import Progress as BatchProgress
from .batch.progress import rich_progress
from .batch.requests import BatchRequest, validate_batch
from .batch.trie import PrefixTrie
from .blocks import (
    BlockRegistry,
    ContextBlock,
    LabelStyle,
    RegisteredBlock,
    check_encodable,
    check_id_length,
    content_id,
    is_list_like,
    render_block,
    unique_label,
    validate_blocks,
)
from .cloud.breakpoints import duplicates_pay, plan_breakpoints
from .cloud.config import CloudCacheConfig
from .cloud.continuation import ContinuationTracker, chained_turns
from .cloud.forecast import IndexSignals, PromptShape, reuse_candidates
from .cloud.keys import ROUTE_WINDOW_S, KeyBuckets, parts_digest, prefix_cache_key
from .cloud.ledger import CacheLedger
from .cloud.segments import SplitSpec
from .conversations import (
    Conversation,
    ConversationStore,
    Turn,
    VersionedConversationStore,
    deduplicate,
    versioned,
)
from .errors import (
    ConfigError,
    ContextPilotError,
    ConversationConflictError,
    ConversationExpiredError,
    InvalidInputError,
    StoreError,
    UnknownConversationError,
)
from .escaping import StructureGuard, template_lead_in, template_line_lead_ins
from .index import ContextIndex, IndexConfig, IndexStats, MatchResult, RequestId
from .index_sync import IndexLogConfig, IndexLogStats, IndexRecord, IndexSync, LoggedPlacement
from .ordering import RemainderOrder, reorder_for_prefix
from .prompt import BlockBoundary, Prompt, PromptStats
from .stores.index_log import index_log_of
from .stores.url import redacted, resolve_store
from .tenants import (
    SHARED_KEY_PREFIX,
    SaltDeriver,
    TenantConfig,
    TenantIndexes,
    check_tenant,
    conversation_key,
    is_tenant_key,
    public_system,
    registry_key,
    salts,
    shared_key,
)
from .tokenizers import Tokenizer, default_tokenizer, get_tokenizer
from .usage import parse_cache_usage

__all__ = [
    "STORE_ATTEMPTS",
    "ContextPilot",
    "PilotConfig",
    "pilot_on_store",
    "structure_guard_of",
]

logger = logging.getLogger(__name__)

_V = TypeVar("_V")
_STORE_PROBE = "contextpilot:store-check"  # a conversation id nobody uses
_SEGMENT_CACHE_SIZE = 65_536
_SEGMENT_CACHE_CHARS = 8_000_000  # of cached texts, per cache
_CHARS_PER_TOKEN_BOUND = 16
STORE_ATTEMPTS = 16  # plans of one call whose conversation write may conflict
_BACK_OFF_S = 0.001  # first back-off after a conflict; doubles, at most _BACK_OFF_MAX_S
_BACK_OFF_MAX_S = 0.05

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the user's question using the context "
    "documents in the conversation. Each document starts with its label in square "
    "brackets; cite labels when you use a document. Notes after the documents may "
    "give their relevance ranking (most relevant first) and name relevant documents "
    "already shown in earlier turns. If the documents do not contain the answer, say so."
)


@dataclass(frozen=True)
class PilotConfig:
    """Behaviour and bounds of a :class:`ContextPilot`.

    ``reorder``/``dedup``/``annotate`` switch the three optimizations. ``remainder``
    orders the blocks that match no cached prefix; with ``"popularity"``, those that
    recent requests carrying the matched prefix mostly carried too go first, remembered
    over the last ``together_window`` requests without a tenant (0: popularity alone,
    as for a tenant's requests; :mod:`~contextpilot_rag.ordering`). ``max_history_turns`` limits the
    turns rendered into a conversation's prompt (``None``: all) and the turns its store
    keeps (older answered ones are dropped; one awaiting its answer keeps the turns
    after it, without their text, up to 1,024 beyond the window; so a long
    conversation's record stays bounded); de-duplication only points at rendered
    turns. ``system_prompt`` is used when ``optimize`` gets none. ``unanswered_text``
    is the assistant message a history turn shows while it has no answer recorded (its
    call failed, or its answer is still on the way) or a blank one, so that the history's roles
    alternate as chat templates such as Gemma's and Mistral's require (they refuse two
    user messages in a row); ``None`` shows no assistant message there.
    ``system_into_user`` sends no system message: the system prompt opens the first
    user message the prompt renders, a blank line before the rest, as Gemma 3's chat
    template does by itself. It is for self-hosted chat templates that refuse a system
    message (Gemma 2's) or render it before the last user message (Mistral Nemo's,
    which rewrites the cached history every turn); hosted-cache planning
    (``cloud``) needs a system message, so the two do not go together.

    ``max_block_chars`` rejects a longer block before it is tokenized (``None``:
    ``16 × max_block_tokens``, more characters per token than text has).
    ``on_history_lost`` decides what ``optimize`` does for a conversation its store
    dropped (TTL or LRU): ``"restart"`` starts it afresh and flags the prompt
    (:attr:`Prompt.history_lost`), ``"raise"`` raises
    :class:`~contextpilot_rag.errors.ConversationExpiredError`.

    ``label_style`` chooses the blocks' labels (:func:`~contextpilot_rag.blocks.block_label`):
    ``"short"`` shows an id longer than 12 characters as five letters of its hash (the
    label line and each note naming the block cost a few tokens, not one per id
    fragment); ``"id"`` shows ids of up to 32 plain characters as they are.
    :attr:`Prompt.labels` maps what a prompt shows back to the block ids either way.

    ``max_observed_prompts`` bounds the prompts whose statistics the pilot keeps (the
    most recent, by request id) so that :meth:`ContextPilot.observe` can take a request
    id instead of the :class:`Prompt`, as framework callbacks do; 0 keeps none.

    ``tenants`` bounds and tunes the per-tenant state of requests made with a
    ``tenant`` (:class:`~contextpilot_rag.tenants.TenantConfig`, ``docs/tenants.md``).

    ``index_log``: whether and how pilots on one shared store share their context
    index and popularity counts (:class:`~contextpilot_rag.index_sync.IndexLogConfig`,
    ``docs/stores.md``); the in-memory default has no log.

    ``cloud``: cache breakpoints and ``prompt_cache_key`` for hosted APIs
    (:class:`~contextpilot_rag.cloud.CloudCacheConfig`, ``docs/cloud.md``).
    """

    index: IndexConfig = field(default_factory=IndexConfig)
    reorder: bool = True
    dedup: bool = True
    annotate: bool = True
    remainder: RemainderOrder = "popularity"
    together_window: int = 1024
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    unanswered_text: str | None = "(no answer)"
    system_into_user: bool = False
    context_header: str = "Context documents:\n\n"
    question_template: str = "Question: {query}"
    notes: NoteTemplates = field(default_factory=NoteTemplates)
    max_block_tokens: int | None = 32_768
    max_block_chars: int | None = None
    max_history_turns: int | None = None
    max_conversations: int = 10_000
    conversation_ttl_s: float | None = 3600.0
    block_registry_size: int = 200_000
    on_history_lost: Literal["restart", "raise"] = "restart"
    max_observed_prompts: int = 4096
    label_style: LabelStyle = "short"
    tenants: TenantConfig = field(default_factory=TenantConfig)
    index_log: IndexLogConfig = field(default_factory=IndexLogConfig)
    cloud: CloudCacheConfig = field(default_factory=CloudCacheConfig)

    def __post_init__(self) -> None:
        self._check_types()
        if self.remainder not in ("popularity", "retrieval"):
            raise ConfigError("PilotConfig.remainder must be 'popularity' or 'retrieval'")
        if "{query}" not in self.question_template:
            raise ConfigError("PilotConfig.question_template must contain '{query}'")
        try:  # any other placeholder would fail only later, inside optimize()
            self.question_template.format(query="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"PilotConfig.question_template may use only '{{query}}': {exc!r}"
            ) from exc
        if self.on_history_lost not in ("restart", "raise"):
            raise ConfigError("PilotConfig.on_history_lost must be 'restart' or 'raise'")
        if self.label_style not in ("short", "id"):
            raise ConfigError("PilotConfig.label_style must be 'short' or 'id'")
        for name in ("max_block_tokens", "max_block_chars", "max_history_turns"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 1):
                raise ConfigError(f"PilotConfig.{name} must be a positive int or None")
        for name in ("max_conversations", "block_registry_size"):
            if not (is_int(getattr(self, name)) and getattr(self, name) >= 1):
                raise ConfigError(f"PilotConfig.{name} must be an int >= 1")
        if not (is_int(self.together_window) and self.together_window >= 0):
            raise ConfigError("PilotConfig.together_window must be an int >= 0")
        ttl = self.conversation_ttl_s
        if ttl is not None and not (is_number(ttl) and 0 < ttl < math.inf):
            raise ConfigError("PilotConfig.conversation_ttl_s must be a finite number > 0, or None")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError("PilotConfig.system_prompt must be a str or None")
        unanswered = self.unanswered_text
        if unanswered is not None and not (isinstance(unanswered, str) and unanswered.strip()):
            # Anthropic refuses a text block with nothing but white space
            raise ConfigError("PilotConfig.unanswered_text must be a str with text, or None")
        observed = self.max_observed_prompts
        if not isinstance(observed, int) or isinstance(observed, bool) or observed < 0:
            raise ConfigError("PilotConfig.max_observed_prompts must be an int >= 0")
        if not isinstance(self.tenants, TenantConfig):
            raise ConfigError("PilotConfig.tenants must be a TenantConfig")
        if not isinstance(self.index_log, IndexLogConfig):
            raise ConfigError("PilotConfig.index_log must be an IndexLogConfig")
        if not isinstance(self.cloud, CloudCacheConfig):
            raise ConfigError("PilotConfig.cloud must be a CloudCacheConfig")
        if self.system_into_user and self.cloud.enabled:
            raise ConfigError(
                "PilotConfig.system_into_user is for self-hosted chat templates; hosted-cache "
                "planning (cloud.enabled) needs the system prompt as a system message"
            )

    def _check_types(self) -> None:
        """The fields whose wrong type would fail only later, inside a call."""
        typed = (
            ("index", IndexConfig),
            ("notes", NoteTemplates),
            ("context_header", str),
            ("question_template", str),
        )
        for name, kind in typed:
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"PilotConfig.{name} must be a {kind.__name__}")
        for name in ("reorder", "dedup", "annotate", "system_into_user"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"PilotConfig.{name} must be a bool")

    @property
    def block_char_limit(self) -> int | None:
        """The length (characters) over which a block is refused untokenized."""
        if self.max_block_chars is not None:
            return self.max_block_chars
        if self.max_block_tokens is None:
            return None
        return self.max_block_tokens * _CHARS_PER_TOKEN_BOUND

    def index_for(self, index: IndexConfig) -> IndexConfig:
        """``index`` as the pilot builds its indexes: with hosted prompt caching on
        (``cloud.enabled``) and no ``ttl_s`` of its own, a path idle for longer than
        the cache lifetime (``cloud.ttl_s``) is dropped. The provider has dropped its
        prefix by then, so it no longer steers the order of new prompts."""
        if self.cloud.enabled and index.ttl_s is None:
            return replace(index, ttl_s=self.cloud.ttl_s)
        return index

    def structure_guard(self) -> StructureGuard:
        """The escaping of untrusted text for this layout (see :mod:`.escaping`)."""
        templates = (
            self.notes.order,
            self.notes.location,
            self.question_template,
            self.context_header,
        )
        return StructureGuard(
            (lead_in for template in templates for lead_in in template_line_lead_ins(template)),
            note_lead_ins=map(template_lead_in, (self.notes.order, self.notes.location)),
        )


_BatchTuple = (
    tuple[Sequence[ContextBlock], str]
    | tuple[Sequence[ContextBlock], str, str | None]
    | tuple[Sequence[ContextBlock], str, str | None, str | None]
)
"""A batch request as a tuple: blocks, query[, conversation_id[, tenant]]."""


class _ShownAnswer(NamedTuple):
    """A history turn's assistant message: its text, its context-index key, its tokens."""

    text: str
    key: str
    tokens: int


class _Layout(NamedTuple):
    """The pieces of one request's prompt, before rendering."""

    original: tuple[ContextBlock, ...]
    final: tuple[ContextBlock, ...]
    duplicated: tuple[tuple[ContextBlock, int], ...]
    order_note: str | None
    location_note: str | None
    note_tokens: int
    query: str
    system_text: str | None
    visible: tuple[tuple[int, Turn], ...]
    relabeled: Mapping[str, str]  # block id -> label, where not the block's own
    history_lost: bool = False


_MINIMUM_MARGIN_TOKENS = 32
"""Tokens a prompt may miss the hosted minimum by and still be reordered (the
estimate leaves out labels' and separators' tokens that rendering adds)."""


class _Order(NamedTuple):
    """A request's block order and what of it an earlier prompt already sent:
    ``matched``, this turn's leading blocks in the cached prefix, and
    ``reusable_tokens``, that prefix's tokens (the fixed prefix included);
    ``cache_salt``: the salt the prompt goes with (``None``: none)."""

    final: tuple[ContextBlock, ...]
    matched: Sequence[str]
    reusable_tokens: int
    cache_salt: str | None


class _Placement(NamedTuple):
    """One index path a tenant's prompt enters: ``tenant``'s index, or the shared
    index (``shared``)."""

    tenant: str
    shared: bool
    path: tuple[str, ...]
    tokens: tuple[int, ...]


class _Plan(NamedTuple):
    """Everything ``optimize`` will commit, computed without side effects."""

    prompt: Prompt
    blocks: tuple[ContextBlock, ...]
    entries: tuple[RegisteredBlock, ...]
    index_path: tuple[str, ...]
    index_tokens: tuple[int, ...]
    conversation: Conversation | None
    stored_version: int = 0  # the conversation's version the plan was made from
    previous: Conversation | None = None  # the record read at that version (None: none)
    keys: tuple[str, ...] | None = None  # the blocks' registry keys (None: their ids)
    placements: tuple[_Placement, ...] | None = None  # a tenant's; None: the main index
    cached_prefixes: tuple[tuple[str, ...], ...] = ()  # ledger keys of its breakpoints


_RETURN_QUANTILE = 0.95
"""A conversation that has not sent its next turn within this quantile of the gaps
between turns is no longer expected on its route (:class:`~.cloud.keys.KeyBuckets`)."""


_BLOCK_REUSE_EVIDENCE = 32
"""Blocks seen anew whose return (or not) must be known before a block no earlier
request carried is expected back: until then it is expected never to be."""


class ContextPilot:
    """Reorders, de-duplicates and annotates context blocks for prefix-cache reuse.

    Thread-safe. ``tokenizer`` is a :class:`Tokenizer`, a registry name, or ``None``
    for the offline default. ``store`` holds conversations: ``None`` in this process's
    memory (bounded by ``config.max_conversations`` and ``conversation_ttl_s``), a URL
    (``"redis://HOST:PORT/DB"``, ``"sqlite:///PATH"``: :func:`~contextpilot_rag.stores.open_store`,
    with the same bounds) or a :class:`~contextpilot_rag.conversations.ConversationStore`.
    Pilots in several processes on one Redis or SQLite store behave as one pilot for
    conversations; a bad URL is a :class:`~contextpilot_rag.errors.ConfigError` raised
    before anything is created. On a Redis or SQLite store they also share their
    context index through the store's index log (``PilotConfig.index_log``): each
    replays the others' requests before planning, so they order documents alike.

    Requests may name a ``tenant``: each tenant then has its own context index,
    conversations, popularity counts and engine cache salt, and only blocks marked
    ``shared`` share prefixes across tenants (``docs/tenants.md``).
    """

    def __init__(
        self,
        config: PilotConfig | None = None,
        *,
        tokenizer: Tokenizer | str | None = None,
        store: ConversationStore | str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or PilotConfig()
        if isinstance(tokenizer, str):
            tokenizer = get_tokenizer(tokenizer)
        self.tokenizer: Tokenizer = tokenizer or default_tokenizer()
        resolved = resolve_store(
            store,
            max_conversations=self.config.max_conversations,
            ttl_s=self.config.conversation_ttl_s,
            clock=clock,
        )
        self._store: VersionedConversationStore = versioned(resolved)
        # A store given to the pilot (a URL or an object) may be shared: request ids then
        # carry a random namespace, so turns written by two pilots never share an id.
        self._request_prefix = "cp-" if store is None else f"cp-{secrets.token_hex(4)}-"
        self._jitter = random.Random()
        self._guard = self.config.structure_guard()
        self._index = ContextIndex(self.config.index_for(self.config.index), clock=clock)
        self._clock = clock
        self._ledger = CacheLedger(self.config.cloud.ledger_size)
        self._key_buckets = KeyBuckets(
            self.config.cloud.key_rate_per_minute, self.config.cloud.ledger_size
        )
        self._continuations = ContinuationTracker(self.config.cloud.ttl_s)
        # whether a system prompt seen anew is sent again within the lifetime (its
        # "turn" 0 followed by a 1)
        self._system_reuse = ContinuationTracker(
            self.config.cloud.ttl_s, capacity=self.config.cloud.ledger_size
        )
        # whether a block seen anew is carried again within the lifetime
        self._block_reuse = ContinuationTracker(
            self.config.cloud.ttl_s, capacity=self.config.cloud.ledger_size
        )
        notes = self.config.notes
        self._lead_ins = tuple(
            template_lead_in(template)
            for template in (notes.order, notes.location, self.config.question_template)
        )
        tenants = self.config.tenants
        # Per tenant: its own index; the shared index holds the shared-block prefixes
        # of unsalted tenant prompts, keyed by content (docs/tenants.md).
        self._tenant_indexes = TenantIndexes(
            self.config.index_for(tenants.index), tenants.max_tenants, clock=clock
        )
        self._shared_index = ContextIndex(self.config.index_for(self.config.index), clock=clock)
        self._salts = SaltDeriver(tenants.salt_key)
        self._warn_random_salt = store is not None and tenants.salt_key is None
        self._registry = BlockRegistry(
            self.tokenizer.count,
            capacity=self.config.block_registry_size,
            label_style=self.config.label_style,
            render=self._render_block,
            window=self.config.together_window,
        )
        self._lock = threading.RLock()
        self._request_numbers = itertools.count(1)
        self._segment_tokens: _TextCache[int] = _TextCache()
        self._system_keys: _TextCache[str] = _TextCache()
        # request id -> stats and tenant of the most recent prompts, oldest first
        self._observed: OrderedDict[str, tuple[PromptStats, str | None]] = OrderedDict()
        self._index_sync = _index_sync(resolved, self.config.index_log)

    # -- public API --------------------------------------------------------------------

    def optimize(
        self,
        blocks: Sequence[ContextBlock],
        query: str,
        *,
        conversation_id: str | None = None,
        system: str | None = None,
        tenant: str | None = None,
    ) -> Prompt:
        """Build the prompt for one request: blocks reordered to reuse the longest
        cached prefix, blocks already in this conversation replaced by a location
        note, notes restoring the relevance ranking, then the question.

        Calls on one conversation are serialised: each sees the turns of the calls
        before it. Pass the returned prompt to :meth:`record_answer` to pair the
        answer with this turn.

        ``tenant`` (a non-empty str of at most 256 characters) keeps the request's
        state apart from every other tenant's: it matches only the tenant's own earlier
        prompts (and the shared prefixes of blocks marked ``shared``), its conversation
        is the tenant's (the same id under another tenant is another conversation), and
        the prompt carries the tenant's :attr:`Prompt.cache_salt` (``docs/tenants.md``).

        ``blocks`` may be empty only for a turn of a conversation (a retrieval with no
        hit): the prompt then carries the history and the question, and the turn enters
        the history like any other; without ``conversation_id``,
        :class:`~.errors.EmptyContextError`."""
        unique = validate_blocks(blocks, allow_empty=conversation_id is not None)
        self._check_request_text("query", query)
        if conversation_id is not None:
            _check_conversation_id(conversation_id, tenant)
        if tenant is not None:
            check_tenant(tenant)
        if system is not None:
            self._check_request_text("system", system)
        limits = self.config.max_block_tokens, self.config.block_char_limit
        keys = None if tenant is None else tuple(registry_key(tenant, block) for block in unique)
        prepared = self._registry.prepare(unique, *limits, keys)  # tokenizing, unlocked
        plan_turn = functools.partial(
            self._plan, unique, query, conversation_id, system, prepared, tenant, keys
        )
        replay = self._index_sync.pending() if self._index_sync is not None else ()
        with self._lock:
            if replay:
                self._replay(replay)
            plan = self._stored(plan_turn)
            self._record(plan)
        if self._index_sync is not None:
            self._index_sync.publish([_index_record(plan)])
        return plan.prompt

    def optimize_batch(
        self,
        requests: Iterable[BatchRequest | _BatchTuple],
        *,
        system: str | None = None,
        method: BatchMethod = "auto",
        schedule: BatchSchedule = "prefix-tree",
        refine: bool | None = None,
        progress: bool = False,
    ) -> list[Prompt]:
        """Plan a whole batch at once and return its prompts **in execution order**;
        each prompt's ``index`` is its request's position in ``requests``.

        ``requests`` are ``(blocks, query)``, ``(blocks, query, conversation_id)`` or
        ``(blocks, query, conversation_id, tenant)`` tuples (or
        :class:`~contextpilot_rag.batch.requests.BatchRequest`). Requests without a
        conversation or a tenant are planned together (``method``, ``schedule``,
        ``refine``: see :func:`contextpilot_rag.batch.plan_batch`) so that those
        sharing blocks share a prefix and run back to back; each carries an order note like online
        prompts. Requests of a conversation (one turn per conversation per batch)
        and requests of a tenant are planned as :meth:`optimize` would (against the
        state before the batch), after the others. All prompts enter
        the context index in execution order. Every error is raised before anything
        is stored, but a store failing midway through the conversations' turns: the
        turns already written are then taken back out before it is raised.
        ``progress`` shows progress bars (stderr) for long builds."""
        batch = validate_batch(requests)
        for request in batch:
            if request.conversation_id is not None:
                _check_conversation_id(request.conversation_id, request.tenant)
            self._check_request_text("query", request.query)
        if system is not None:
            self._check_request_text("system", system)
        with contextlib.ExitStack() as stack:
            bars = stack.enter_context(rich_progress()) if progress else no_progress
            replay = self._index_sync.pending() if self._index_sync is not None else ()
            with self._lock:
                if replay:
                    self._replay(replay)
                planned = self._plan_batch(batch, system, method, schedule, refine, bars)
                plans = self._stored_batch(planned, batch, system)
                for plan in plans:
                    self._record(plan)
        if self._index_sync is not None:
            self._index_sync.publish([_index_record(plan) for plan in plans])
        return [plan.prompt for plan in plans]

    def _check_request_text(self, name: str, value: str) -> None:
        """A str, encodable, and no longer than a block may be
        (:attr:`PilotConfig.block_char_limit`): it is tokenized while the pilot's lock
        is held, so an unbounded one would stall every other call."""
        _check_text(name, value)
        limit = self.config.block_char_limit
        if limit is not None and len(value) > limit:
            raise InvalidInputError(
                f"{name} is {len(value):,} characters, over the {limit:,} a block may have "
                "(PilotConfig.max_block_chars / max_block_tokens)"
            )

    def record_answer(
        self,
        prompt: Prompt | str,
        text: str,
        *,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> None:
        """Record ``text`` as the answer to the turn ``prompt`` asked, so later turns
        carry it as history.

        ``prompt`` is the :class:`Prompt` that was sent (the pairing is then exact,
        whatever else ran on the conversation meanwhile), or a conversation id with
        the turn's ``request_id``, or a conversation id alone: that answers the one
        turn awaiting its answer, and is refused
        (:class:`~contextpilot_rag.errors.ConversationStateError`) when several
        await one. Raises :class:`~contextpilot_rag.errors.ConversationExpiredError`
        when the conversation's history was lost. The answer is stored escaped as it
        will be shown (control tokens and structure-like lines neutralised). Recording
        the same text for the same turn again changes nothing, so a call that failed
        with :class:`~contextpilot_rag.errors.StoreUnavailableError` can be retried
        (its write may have been applied); another text for an answered turn is refused.
        ``tenant``: the conversation's tenant when ``prompt`` is a conversation id (a
        :class:`Prompt` knows its own; another ``tenant`` with it is refused)."""
        conversation_id, request_id = _answer_target(prompt, request_id)
        tenant = _tenant_of(prompt, tenant)
        if not isinstance(prompt, Prompt):
            _check_conversation_id(conversation_id, tenant)
        _check_text("text", text)
        answer = self._guard.escape(text)
        tokens = self.tokenizer.count(answer)
        key = conversation_key(tenant, conversation_id)
        with self._lock:
            for attempt in range(STORE_ATTEMPTS):
                stored = self._store.get_versioned(key)
                conversation = stored.conversation
                if conversation is None:
                    raise self._missing(conversation_id, stored.forgotten, key)
                if _holds_answer(conversation, request_id, answer):
                    return  # an earlier try's write was applied (its reply was lost)
                answered = conversation.with_answer(answer, tokens, request_id=request_id)
                if request_id is None:  # the one turn awaiting its answer, pinned for retries
                    request_id = conversation.awaiting_answer()[0].request_id
                if self._store.put_if_version(answered, stored.version):
                    return
                self._back_off(attempt)
            raise _conflict(conversation_id)

    def conversation(self, conversation_id: str, *, tenant: str | None = None) -> Conversation:
        """The stored record of a conversation (of ``tenant``'s conversations)."""
        key = self._conversation_key(conversation_id, tenant)
        conversation = self._store.get(key)
        if conversation is None:
            raise self._missing(conversation_id, None, key)
        if key != conversation_id:
            return replace(conversation, conversation_id=conversation_id)
        return conversation

    def end_conversation(self, conversation_id: str, *, tenant: str | None = None) -> bool:
        """Forget a conversation's history (its cached prefix ages out of the index),
        or acknowledge that its store lost it: the id then starts a new conversation
        without a loss being reported."""
        key = self._conversation_key(conversation_id, tenant)
        with self._lock:
            return self._store.delete(key)

    def evict(self, request_ids: Iterable[str]) -> int:
        """The engine evicted these requests' cache: forget them in the index.
        Unknown ids are ignored; returns how many were removed."""
        if not is_list_like(request_ids):
            raise InvalidInputError(
                f"evict() takes an iterable of request id strings, got {type(request_ids).__name__}"
            )
        ids = list(request_ids)
        for request_id in ids:
            if not isinstance(request_id, str):
                raise InvalidInputError(
                    f"evict() takes request id strings, got {type(request_id).__name__} "
                    f"{request_id!r}"
                )
        with self._lock:
            removed = self._index.evict([RequestId(request_id) for request_id in ids])
            return removed + self._evict_tenants([RequestId(request_id) for request_id in ids])

    def _evict_tenants(self, ids: Sequence[RequestId]) -> int:
        """Remove ``ids`` from the tenants' and the shared index; how many requests
        were held there (one held in both counts once)."""
        held: set[RequestId] = set()
        for index in (self._shared_index, *self._tenant_indexes):
            found = [request_id for request_id in ids if request_id in index]
            if found:
                index.evict(found)
                held.update(found)
        return len(held)

    def observe(
        self,
        prompt: Prompt | str,
        usage: object,
        *,
        tolerance: float = 0.1,
        tenant: str | None = None,
    ) -> int:
        """:meth:`observe_cache` fed by the usage report of the answer to ``prompt``, in
        any shape :func:`~contextpilot_rag.usage.parse_cache_usage` reads (OpenAI /
        vLLM / SGLang ``usage``, llama-server ``timings``, LangChain ``usage_metadata``,
        Anthropic or Gemini usage, or the response, message or framework result
        carrying one). ``prompt`` is the :class:`Prompt` that was sent or its
        ``request_id`` (one of the last ``PilotConfig.max_observed_prompts``). A
        report without cache information, or a request id the pilot does not
        remember, raises :class:`InvalidInputError` and changes nothing. Returns how
        many requests were evicted. A request id of a tenant's prompt is known only
        with that ``tenant``."""
        _check_observed(prompt, "observe")
        reported = parse_cache_usage(usage)
        return self.observe_cache(
            prompt,
            reported.cached_tokens,
            reported.prompt_tokens,
            tolerance=tolerance,
            tenant=tenant,
        )

    def observe_cache(
        self,
        prompt: Prompt | str,
        cached_tokens: int,
        prompt_tokens: int,
        *,
        tolerance: float = 0.1,
        tenant: str | None = None,
    ) -> int:
        """Feedback from the engine that answered ``prompt`` (the :class:`Prompt`, or
        its ``request_id`` as :meth:`observe` takes it): it served ``cached_tokens``
        of its ``prompt_tokens`` (in the engine's tokens) from its prefix cache. When
        that share falls short of the share this pilot predicted reusable
        (``prompt.stats``) by more than ``tolerance``, and the prediction rested on
        context blocks matched in the index, the earlier requests that share the
        prompt's path up to its first block the engine did not serve (and at least its
        first context block) are evicted: the engine no longer holds them. ``prompt``
        itself stays (the engine has just cached it). Returns how many were evicted.
        ``tenant``: the tenant of a prompt given by request id (see :meth:`observe`)."""
        _check_observed(prompt, "observe_cache")
        if tenant is not None:
            check_tenant(tenant)
        for name, value in (("cached_tokens", cached_tokens), ("prompt_tokens", prompt_tokens)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidInputError(f"observe_cache(): {name} must be an int, got {value!r}")
        if not 0 <= cached_tokens <= prompt_tokens or prompt_tokens < 1:
            raise InvalidInputError(
                "observe_cache() needs 0 <= cached_tokens <= prompt_tokens and prompt_tokens >= 1"
            )
        if not (is_number(tolerance) and 0 <= tolerance <= 1):
            raise InvalidInputError(
                f"observe_cache(): tolerance must be a number in [0, 1], got {tolerance!r}"
            )
        with self._lock:
            request_id, stats, tenant = self._observed_prompt(prompt, tenant)
            predicted = stats.reusable_tokens / max(1, stats.prompt_tokens)
            if stats.blocks_matched < 1 or cached_tokens / prompt_tokens >= predicted - tolerance:
                return 0
            index = self._index_holding(request_id, tenant)
            if index is None:
                return 0
            served = cached_tokens / prompt_tokens * stats.prompt_tokens  # pilot tokens
            tokens = index.request_tokens(request_id)
            depth = 1  # the path up to its first block not served ...
            while depth < len(tokens) and sum(tokens[:depth]) <= served:
                depth += 1
            # ... but at least one matched context block: the system prompt and the
            # history are not this pilot's prediction
            depth = max(depth, _fixed_entries(index, request_id, stats, self._shared_index) + 1)
            return index.evict(index.requests_sharing(request_id, depth))

    def _observed_prompt(
        self, prompt: Prompt | str, tenant: str | None
    ) -> tuple[RequestId, PromptStats, str | None]:
        """The request id, stats and tenant of a prompt given itself or by request id
        (lock held); an id not among the remembered prompts of ``tenant`` is
        :class:`InvalidInputError`."""
        if isinstance(prompt, Prompt):
            return RequestId(prompt.request_id), prompt.stats, _tenant_of(prompt, tenant)
        held = self._observed.get(prompt)
        if held is None or held[1] != tenant:  # another tenant's id: as unknown
            raise InvalidInputError(
                f"no recent prompt has request id {prompt!r}: unknown, or older than the "
                f"last PilotConfig.max_observed_prompts={self.config.max_observed_prompts} "
                "prompts; pass the Prompt itself"
            )
        return RequestId(prompt), held[0], tenant

    def _index_holding(self, request_id: RequestId, tenant: str | None) -> ContextIndex | None:
        """The index ``request_id`` of ``tenant`` is in (its tenant's, else the shared
        one), or ``None``."""
        if tenant is None:
            return self._index if request_id in self._index else None
        own = self._tenant_indexes.peek(tenant)
        if own is not None and request_id in own:
            return own
        return self._shared_index if request_id in self._shared_index else None

    def _conversation_key(self, conversation_id: str, tenant: str | None) -> str:
        """The store key of ``tenant``'s conversation ``conversation_id``, checked."""
        _check_conversation_id(conversation_id, tenant)
        if tenant is not None:
            check_tenant(tenant)
        return conversation_key(tenant, conversation_id)

    def index_log_stats(self) -> IndexLogStats | None:
        """What this pilot shared through its store's index log (``None``: no log, as
        with the in-memory default or ``PilotConfig.index_log.enabled=False``)."""
        return None if self._index_sync is None else self._index_sync.stats()

    def _replay(self, records: Sequence[IndexRecord]) -> None:
        """Index other pilots' requests from the store's index log as if this pilot
        had sent them (lock held); one already indexed here is skipped."""
        for record in records:
            request_id = RequestId(record.request_id)
            for place in record.placements:
                if place.kind == "main":
                    index = self._index
                elif place.kind == "shared":
                    index = self._shared_index
                else:
                    assert record.tenant is not None  # decode_record checks it
                    index = self._tenant_indexes.get(record.tenant)
                if request_id not in index:
                    index.insert(place.path, place.tokens, request_id)
            self._registry.count_carried(record.counted, together=record.tenant is None)

    def index_stats(self, *, tenant: str | None = None) -> IndexStats:
        """The context index's size: the index of requests without a tenant, or
        ``tenant``'s own (all zeros when it holds none: no prompt yet, or dropped as the
        least recently used of ``PilotConfig.tenants.max_tenants``)."""
        if tenant is None:
            with self._lock:
                return self._index.stats()
        check_tenant(tenant)
        with self._lock:
            index = self._tenant_indexes.peek(tenant)
            return IndexStats(0, 0, 0, 0) if index is None else index.stats()

    # -- planning (no side effects) -----------------------------------------------------

    def _plan(
        self,
        blocks: tuple[ContextBlock, ...],
        query: str,
        conversation_id: str | None,
        system: str | None,
        prepared: Mapping[str, RegisteredBlock] | None = None,
        tenant: str | None = None,
        keys: tuple[str, ...] | None = None,
    ) -> _Plan:
        """``keys``: the blocks' registry keys (a tenant's request; ``None``: their ids).

        With hosted-cache planning on, a later turn whose de-duplication leaves the
        prompt under the model's minimum cacheable prefix, where sending its repeated
        blocks in full would reach it, is planned both ways and the cheaper kept
        (:func:`~.cloud.breakpoints.duplicates_pay`): a prompt under the minimum is
        cached by nobody, so the next turn pays all of it again."""
        plan_with = functools.partial(
            self._plan_with, blocks, query, conversation_id, system, prepared, tenant, keys
        )
        plan = plan_with(None, dedup=self.config.dedup)
        cloud = self.config.cloud
        if not (cloud.enabled and plan.prompt.deduplicated and plan.conversation is not None):
            return plan
        if plan.prompt.stats.prompt_tokens >= cloud.rules.min_tokens(cloud.model):
            return plan  # cacheable as it is
        whole = plan_with(plan.prompt.request_id, dedup=False)
        turn = plan.conversation.turn_count - 1
        next_turn = cloud.next_turn_probability
        if next_turn is None:
            next_turn = self._continuations.probability(turn, self._clock())
        pays = duplicates_pay(
            whole.prompt.stats.prompt_tokens,
            plan.prompt.stats.prompt_tokens,
            cloud.rules,
            model=cloud.model,
            ttl=cloud.ttl,
            next_turn=next_turn,
        )
        return whole if pays else plan

    def _plan_with(
        self,
        blocks: tuple[ContextBlock, ...],
        query: str,
        conversation_id: str | None,
        system: str | None,
        prepared: Mapping[str, RegisteredBlock] | None,
        tenant: str | None,
        keys: tuple[str, ...] | None,
        request_id: str | None,
        *,
        dedup: bool,
    ) -> _Plan:
        """One plan of a turn (see :meth:`_plan`), de-duplicating as ``dedup`` says;
        ``request_id`` ``None``: a new one, taken once the request has passed every
        check (a failed call takes no number)."""
        entries = self._registry.resolve(
            blocks, self.config.max_block_tokens, prepared, self.config.block_char_limit, keys
        )
        rendered = {block.id: entry for block, entry in zip(blocks, entries, strict=True)}
        tokens_of = {block_id: entry.tokens for block_id, entry in rendered.items()}
        conversation, history_lost, version = self._load_conversation(
            conversation_id, system, tenant
        )
        previous = conversation if version else None
        system_text = _pick_system(system, conversation, self.config.system_prompt)
        visible = conversation.visible_turns(self.config.max_history_turns) if conversation else ()
        kept, duplicated = self._deduplicate(blocks, visible, dedup)
        fixed_prefix, fixed_tokens = self._fixed_prefix(system_text, visible)
        keep_order = self._below_hosted_minimum(fixed_tokens, kept, tokens_of)
        if tenant is None and keep_order:
            # no hosted cache can serve any part of it: keep the retriever's order
            match = self._index.search((), fixed_prefix=(*fixed_prefix, *(b.id for b in kept)))
            matched = match.blocks[len(fixed_prefix) :]
            order = _Order(kept, matched, match.tokens, None)
        elif tenant is None:
            match = self._match(kept, fixed_prefix, tokens_of)
            matched = match.blocks[len(fixed_prefix) :]  # this turn's blocks only
            final = self._reorder(kept, matched, tokens_of, after_history=bool(visible))
            order = _Order(final, matched, match.tokens, None)
        else:
            assert keys is not None
            popularity = dict(zip((block.id for block in blocks), keys, strict=True))
            order = self._tenant_order(
                tenant,
                kept,
                fixed_prefix,
                tokens_of,
                popularity,
                visible=bool(visible),
                salted=self._salted(kept, conversation is not None, system_text),
                keep_order=keep_order,
            )
        final = order.final
        relabeled = _relabeled(final, duplicated, visible, self._own_labels(rendered))
        rendered = self._render_relabeled(rendered, final, relabeled)
        # a note's turn numbers count the turns the prompt renders (behind a history
        # window the first one shown is turn 1): the model can only count those
        first_shown = visible[0][0] if visible else 0
        in_window = tuple((block, turn - first_shown) for block, turn in duplicated)
        notes = self._notes(blocks, final, in_window, rendered, relabeled)
        if request_id is None:
            request_id = self._new_request_id(tenant)
        layout = _Layout(
            blocks,
            final,
            duplicated,
            *notes,
            self._guard.escape(query),
            system_text,
            visible,
            relabeled,
            history_lost,
        )
        prompt = self._render(
            layout,
            rendered,
            request_id,
            conversation_id,
            order.matched,
            reusable_tokens=order.reusable_tokens,
            blocks_start_tokens=sum(fixed_tokens),
            tenant=tenant,
            cache_salt=order.cache_salt,
        )
        block_ids = tuple(block.id for block in final)
        block_tokens = tuple(rendered[block_id].tokens for block_id in block_ids)
        if conversation is not None:
            head = "" if visible else self._system_head(system_text)
            new_turn = _turn(prompt, final, block_tokens, query, len(head))
            conversation = conversation.with_turn(new_turn, keep=self.config.max_history_turns)
        # The tail (notes and question) is indexed too: the engine caches it, and the
        # next turn's history starts with it.
        index_path = (*fixed_prefix, *block_ids, f"\x00tail:{request_id}")
        index_tokens = (*fixed_tokens, *block_tokens, prompt.stats.tail_tokens)
        prompt, cached_prefixes = self._for_hosted_cache(
            prompt,
            index_path,
            fixed_tokens,
            visible,
            _keys_by_id(blocks, keys),
            turn=conversation.turn_count - 1 if conversation is not None else 0,
            stored_key=conversation.cache_key if conversation is not None else None,
        )
        if conversation is not None and conversation.cache_key is None:
            conversation = replace(conversation, cache_key=prompt.prompt_cache_key)
        placements = None
        if tenant is not None:
            placements = self._placements(
                tenant, order, len(fixed_prefix), index_path, index_tokens, visible=bool(visible)
            )
        return _Plan(
            prompt=prompt,
            blocks=blocks,
            entries=entries,
            index_path=index_path,
            index_tokens=index_tokens,
            conversation=conversation,
            stored_version=version,
            previous=previous,
            keys=keys,
            placements=placements,
            cached_prefixes=cached_prefixes,
        )

    def _new_request_id(self, tenant: str | None) -> str:
        """A fresh request id: numbered without a tenant; random with one, so that a
        tenant's ids tell nothing of how many requests other tenants made."""
        if tenant is None:
            return f"{self._request_prefix}{next(self._request_numbers):09d}"
        return f"{self._request_prefix}{secrets.token_hex(8)}"

    # -- tenants (docs/tenants.md) ------------------------------------------------------

    def _salted(self, kept: Sequence[ContextBlock], conversation: bool, system: str | None) -> bool:
        """Whether a tenant's prompt goes with its tenant's salt
        (:func:`~contextpilot_rag.tenants.salts`)."""
        tenants = self.config.tenants
        return salts(
            tenants.cache_salt,
            private_blocks=not all(block.shared for block in kept),
            conversation=conversation,
            public_system=public_system(
                system, self.config.system_prompt, tenants.shared_system_prompts
            ),
        )

    def _tenant_order(
        self,
        tenant: str,
        kept: tuple[ContextBlock, ...],
        fixed_prefix: tuple[str, ...],
        tokens_of: Mapping[str, int],
        registry_keys: Mapping[str, str],
        *,
        visible: bool,
        salted: bool,
        keep_order: bool,
    ) -> _Order:
        """A tenant's block order and its cached match. After a conversation's history
        only the tenant's own index can match. Otherwise the shared blocks come first,
        ordered by the index of the prompt's cache namespace (the shared index when
        unsalted, the tenant's when salted), then the private blocks, ordered by the
        tenant's index after exactly that shared prefix. ``keep_order``: the
        retriever's order, matched as it stands (a prompt under the hosted model's
        minimum cacheable prefix, :meth:`_below_hosted_minimum`)."""
        salt = self._salt_of(tenant) if salted else None
        # the tenant's index is its prompts' cache namespace, unless its prompts are
        # salted only sometimes (policy "private"): then not an unsalted prompt's
        own_namespace = salted or self.config.tenants.cache_salt == "never"
        own = self._tenant_indexes.peek(tenant) if own_namespace else None
        if keep_order:
            return self._tenant_kept_order(kept, fixed_prefix, own, salt, visible=visible)
        if visible or not self.config.reorder:
            index = own if own_namespace else self._shared_index
            match = _search(index, kept if self.config.reorder else (), fixed_prefix, tokens_of)
            matched = match.blocks[len(fixed_prefix) :]
            final = self._reorder(kept, matched, tokens_of, after_history=visible)
            return _Order(final, matched, match.tokens, salt)

        def popularity(block_id: str) -> int:
            return self._registry.popularity(registry_keys[block_id])

        # popularity alone: which recent requests came together is remembered for
        # requests without a tenant only (one window for all tenants would let each
        # one's traffic change another's order)
        order = functools.partial(
            reorder_for_prefix,
            remainder=self.config.remainder,
            popularity=popularity,
            tokens=tokens_of.__getitem__,
        )
        shared = [block for block in kept if block.shared]
        if salted:
            by_shared = _search(own, shared, fixed_prefix, tokens_of)
            shared_order = order(shared, by_shared.blocks[len(fixed_prefix) :])
        else:
            by_shared, shared_matched = self._match_shared(shared, fixed_prefix, tokens_of)
            shared_order = order(shared, shared_matched)
        head = (*fixed_prefix, *(block.id for block in shared_order))
        private = [block for block in kept if not block.shared]
        by_own = _search(own, private, head, tokens_of)
        final = (*shared_order, *order(private, by_own.blocks[len(head) :]))
        # the engine serves the longer of the two cached prefixes
        best = by_own if by_own.tokens >= by_shared.tokens else by_shared
        matched = tuple(block.id for block in final[: max(0, len(best.blocks) - len(fixed_prefix))])
        return _Order(final, matched, best.tokens, salt)

    def _tenant_kept_order(
        self,
        kept: tuple[ContextBlock, ...],
        fixed_prefix: tuple[str, ...],
        own: ContextIndex | None,
        salt: str | None,
        *,
        visible: bool,
    ) -> _Order:
        """A tenant's blocks in the retriever's order, and what of that exact prefix
        its cache namespace holds: the tenant's index, and for an unsalted prompt
        without history also the shared index (by content, over the leading shared
        blocks, as :meth:`_placements` records them); the longer match counts."""
        ids = tuple(block.id for block in kept)
        best = MatchResult((), 0)
        if own is not None:
            best = own.search((), fixed_prefix=(*fixed_prefix, *ids))
        if salt is None and not visible:
            count = next((n for n, block in enumerate(kept) if not block.shared), len(kept))
            keys = tuple(shared_key(block) for block in kept[:count])
            by_shared = self._shared_index.search((), fixed_prefix=(*fixed_prefix, *keys))
            if by_shared.tokens > best.tokens:
                best = by_shared
        matched = ids[: max(0, len(best.blocks) - len(fixed_prefix))]
        return _Order(kept, matched, best.tokens, salt)

    def _match_shared(
        self,
        shared: Sequence[ContextBlock],
        fixed_prefix: tuple[str, ...],
        tokens_of: Mapping[str, int],
    ) -> tuple[MatchResult, tuple[str, ...]]:
        """The shared blocks' match in the shared index (keyed by content), and the
        ids of the blocks it matched, in cached order."""
        ids = {shared_key(block): block.id for block in shared}
        tokens = {key: tokens_of[block_id] for key, block_id in ids.items()}
        match = self._shared_index.search(list(ids), fixed_prefix=fixed_prefix, token_counts=tokens)
        return match, tuple(ids[key] for key in match.blocks[len(fixed_prefix) :])

    def _salt_of(self, tenant: str) -> str:
        if self._warn_random_salt:
            self._warn_random_salt = False
            logger.warning(
                "tenant cache salts come from a random key of this pilot: other processes "
                "on the same store salt the same tenant differently (no shared engine "
                "cache between them); set PilotConfig.tenants.salt_key"
            )
        return self._salts.salt(tenant)

    def _placements(
        self,
        tenant: str,
        order: _Order,
        fixed_length: int,
        path: tuple[str, ...],
        tokens: tuple[int, ...],
        *,
        visible: bool,
    ) -> tuple[_Placement, ...]:
        """Where a tenant's prompt is indexed: in its tenant's index when salted (its
        cache namespace) or when nothing is salted (policy ``"never"``); the leading
        shared blocks of an unsalted prompt without history also in the shared index,
        by content (with the tail: of no tokens after a private block, a leaf of the
        request's own, which the index's node bound and LRU count and drop, where the
        shared prefix's node would collect every such request's id)."""
        placements = []
        if order.cache_salt is not None or self.config.tenants.cache_salt == "never":
            placements.append(_Placement(tenant, False, path, tokens))
        if order.cache_salt is None and not visible:
            final = order.final
            count = next((n for n, block in enumerate(final) if not block.shared), len(final))
            end = fixed_length + count
            shared_path = (*path[:fixed_length], *map(shared_key, final[:count]))
            if count == len(final):
                placements.append(_Placement(tenant, True, (*shared_path, path[-1]), tokens))
            elif count:
                leaf = ((*shared_path, path[-1]), (*tokens[:end], 0))
                placements.append(_Placement(tenant, True, *leaf))
        return tuple(placements)

    def _plan_batch(
        self,
        batch: Sequence[BatchRequest],
        system: str | None,
        method: BatchMethod,
        schedule: BatchSchedule,
        refine: bool | None,
        progress: BatchProgress,
    ) -> list[_Plan]:
        # a tenant's blocks are resolved under the tenant's keys, in its own plan
        untenanted = [request for request in batch if request.tenant is None]
        unique = {block.id: block for request in untenanted for block in request.blocks}
        resolved = dict(
            zip(
                unique,
                self._registry.resolve(
                    tuple(unique.values()),
                    self.config.max_block_tokens,
                    max_chars=self.config.block_char_limit,
                ),
                strict=True,
            )
        )  # each distinct block tokenized once for the whole batch
        free = [
            index
            for index, request in enumerate(batch)
            if request.conversation_id is None and request.tenant is None
        ]
        entries = {i: tuple(resolved[block.id] for block in batch[i].blocks) for i in free}
        codes: dict[str, int] = {}
        requests = [[codes.setdefault(b.id, len(codes)) for b in batch[i].blocks] for i in free]
        plan = plan_batch(
            requests,
            method=method if self.config.reorder else "greedy",
            schedule=schedule,
            weights=[resolved[block_id].tokens for block_id in codes],
            refine=refine,
            progress=progress,
        )
        system_text = system if system is not None else self.config.system_prompt
        fixed_prefix, fixed_tokens = self._fixed_prefix(system_text, ())
        sent = PrefixTrie()  # the final sequences of the requests scheduled so far
        plans: list[_Plan] = []
        advance = progress("batch: prompts", len(batch))
        for slot in plan.schedule:
            index = free[slot]
            request, request_entries = batch[index], entries[index]
            order = plan.orders[slot] if self.config.reorder else range(len(request.blocks))
            final = tuple(request.blocks[position] for position in order)
            matched = sent.add([requests[slot][position] for position in order], slot)
            plans.append(
                self._plan_fixed_order(
                    request,
                    request_entries,
                    final,
                    matched,
                    system_text,
                    (fixed_prefix, fixed_tokens),
                    index,
                )
            )
            advance(1)
        for index, request in enumerate(batch):
            if request.conversation_id is not None or request.tenant is not None:
                plans.append(self._plan_batch_turn(request, system, index))
                advance(1)
        return plans

    def _plan_batch_turn(self, request: BatchRequest, system: str | None, index: int) -> _Plan:
        """A batch request of a conversation or a tenant, planned as :meth:`optimize`
        would."""
        blocks, tenant = tuple(request.blocks), request.tenant
        keys = None if tenant is None else tuple(registry_key(tenant, block) for block in blocks)
        single = self._plan(
            blocks, request.query, request.conversation_id, system, None, tenant, keys
        )
        return single._replace(prompt=replace(single.prompt, index=index))

    def _plan_fixed_order(
        self,
        request: BatchRequest,
        entries: tuple[RegisteredBlock, ...],
        final: tuple[ContextBlock, ...],
        matched: int,
        system_text: str | None,
        fixed: tuple[tuple[str, ...], tuple[int, ...]],
        index: int,
    ) -> _Plan:
        """A batch request's plan, its block order decided by the batch planner;
        ``matched``: how many leading blocks an earlier request of the batch sends."""
        blocks = tuple(request.blocks)
        registered = dict(zip([block.id for block in blocks], entries, strict=True))
        relabeled = _relabeled(final, (), (), self._own_labels(registered))
        rendered = self._render_relabeled(registered, final, relabeled)
        order, location, note_tokens = self._notes(blocks, final, (), rendered, relabeled)
        request_id = f"{self._request_prefix}{next(self._request_numbers):09d}"
        fixed_prefix, fixed_tokens = fixed
        start_tokens = sum(fixed_tokens)
        block_ids = tuple(block.id for block in final)
        block_tokens = tuple(rendered[block_id].tokens for block_id in block_ids)
        prompt = self._render(
            _Layout(
                blocks,
                final,
                (),
                order,
                location,
                note_tokens,
                self._guard.escape(request.query),
                system_text,
                (),
                relabeled,
            ),
            rendered,
            request_id,
            None,
            block_ids[:matched],
            reusable_tokens=start_tokens + sum(block_tokens[:matched]),
            blocks_start_tokens=start_tokens,
        )
        index_path = (*fixed_prefix, *block_ids, f"\x00tail:{request_id}")
        prompt, cached_prefixes = self._for_hosted_cache(prompt, index_path, fixed_tokens, (), None)
        return _Plan(
            prompt=replace(prompt, index=index),
            blocks=blocks,
            entries=entries,
            index_path=index_path,
            index_tokens=(*fixed_tokens, *block_tokens, prompt.stats.tail_tokens),
            conversation=None,
            cached_prefixes=cached_prefixes,
        )

    def _load_conversation(
        self, conversation_id: str | None, system: str | None, tenant: str | None = None
    ) -> tuple[Conversation | None, bool, int]:
        """The conversation (a new record when none is stored, under ``tenant``'s key),
        whether its history was lost (the store dropped it, by TTL or LRU, since its
        last turn) and the version it was read at (0: none stored)."""
        if conversation_id is None:
            return None, False, 0
        key = conversation_key(tenant, conversation_id)
        stored = self._store.get_versioned(key)
        if stored.conversation is not None:
            return stored.conversation, False, stored.version
        lost = stored.forgotten
        if lost:
            if self.config.on_history_lost == "raise":
                raise _expired(conversation_id)
            logger.warning(
                "conversation %r expired or was evicted; its history is lost and it "
                "starts again (Prompt.history_lost is set)",
                conversation_id,
            )
        system_text = _pick_system(system, None, self.config.system_prompt)
        return Conversation(key, system_text), lost, 0

    def _missing(
        self, conversation_id: str, forgotten: bool | None = None, key: str | None = None
    ) -> UnknownConversationError:
        """The error for a conversation its store does not hold (``key``: its store
        key, when not ``conversation_id``)."""
        if forgotten is None:
            forgotten = self._store.forgotten(key or conversation_id)
        if forgotten:
            return _expired(conversation_id)
        return UnknownConversationError(
            f"no live conversation {conversation_id!r} (never started, or ended)"
        )

    def _own_labels(
        self, registered: Mapping[str, RegisteredBlock]
    ) -> Mapping[str, RegisteredBlock] | None:
        """The entries whose labels ``_relabeled`` must read: none in the default
        style, where every entry is labeled by its block's own label."""
        return None if self.config.label_style == "short" else registered

    def _render_block(self, block: ContextBlock, label: str) -> str:
        return render_block(block, self._guard, label=label)

    def _render_relabeled(
        self,
        rendered: dict[str, RegisteredBlock],
        final: Sequence[ContextBlock],
        relabeled: Mapping[str, str],
    ) -> dict[str, RegisteredBlock]:
        """``rendered`` with the blocks that show another label than the registry
        rendered them under (a collision in this prompt) rendered under that label."""
        if not relabeled:
            return rendered
        moved = [
            (block, label)
            for block in final
            if (label := relabeled.get(block.id)) is not None and label != rendered[block.id].label
        ]
        if not moved:
            return rendered
        rendered = dict(rendered)
        count = self.tokenizer.count
        for block, label in moved:
            text = self._render_block(block, label)
            rendered[block.id] = RegisteredBlock(
                block.text, text, count(text), count(" " + label), label
            )
        return rendered

    def _deduplicate(
        self, blocks: tuple[ContextBlock, ...], visible: Sequence[tuple[int, Turn]], dedup: bool
    ) -> tuple[tuple[ContextBlock, ...], tuple[tuple[ContextBlock, int], ...]]:
        if not visible:
            return blocks, ()
        result = deduplicate(blocks, visible)  # refuses changed texts, dedup or not
        if not dedup:
            return blocks, ()
        return result.kept, result.deduplicated

    def _fixed_prefix(
        self, system_text: str | None, visible: Sequence[tuple[int, Turn]]
    ) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The part of the prompt before this turn's blocks, as index keys: the
        system prompt (with the context header), then each rendered turn's blocks
        and its tail (notes, question, answer)."""
        path = [self._system_key(system_text or "")]
        tokens = [
            self._count_segment(self._system_head(system_text) or system_text or "")
            + self._count_segment(self.config.context_header)
        ]
        header_tokens = self._count_segment(self.config.context_header)
        for _, turn in visible:
            path.extend(turn.block_ids)
            tokens.extend(turn.block_tokens)
            path.append(turn.tail_id)
            tokens.append(turn.tail_tokens)
            shown = self._shown_answer(turn)
            if shown is not None:
                # a node of its own: a prompt sent before the answer was recorded
                # does not share what follows the question
                path.append(shown.key)
                tokens.append(shown.tokens)
            tokens[-1] += header_tokens  # the next user message starts with the header
        return tuple(path), tuple(tokens)

    def _below_hosted_minimum(
        self,
        fixed_tokens: Sequence[int],
        kept: Sequence[ContextBlock],
        tokens_of: Mapping[str, int],
    ) -> bool:
        """With hosted-cache planning on, whether everything another request could
        share with this prompt (the fixed prefix and the blocks; its question is its
        own) is shorter than the model's minimum cacheable prefix, less a page of
        margin. A provider then serves no part of it from cache, to this request or to
        any later one (a shared prefix is never longer), so reordering gains nothing
        and its order note is a cost on every request. A self-hosted engine caches
        any page, so without planning the answer is always no."""
        cloud = self.config.cloud
        if not (cloud.enabled and self.config.reorder):
            return False
        shareable = sum(fixed_tokens) + sum(tokens_of[block.id] for block in kept)
        return shareable + _MINIMUM_MARGIN_TOKENS < cloud.rules.min_tokens(cloud.model)

    def _match(
        self,
        kept: Sequence[ContextBlock],
        fixed_prefix: Sequence[str],
        tokens_of: dict[str, int],
    ) -> MatchResult:
        """The cached match; its ``blocks`` start with the fixed prefix, its
        ``tokens`` count the fixed prefix too. Without dedup the history may hold
        some of the request's blocks: they are no match here."""
        wanted = [block.id for block in kept] if self.config.reorder else []
        return self._index.search(wanted, fixed_prefix=fixed_prefix, token_counts=tokens_of)

    def _reorder(
        self,
        kept: tuple[ContextBlock, ...],
        matched: Sequence[str],
        tokens_of: Mapping[str, int],
        *,
        after_history: bool,
    ) -> tuple[ContextBlock, ...]:
        """Matched blocks first. The rest are ordered for future sharing only when
        they follow the bare system prompt (by popularity weighed by ``tokens_of``,
        :mod:`.ordering`): after a conversation's history no other request can share
        them, so they keep the retriever's order (and need no order note)."""
        if not self.config.reorder:
            return kept
        return reorder_for_prefix(
            kept,
            matched,
            remainder="retrieval" if after_history else self.config.remainder,
            popularity=self._registry.popularity,
            tokens=tokens_of.__getitem__,
            together=self._registry.together,
            recent=self._registry.recent,
        )

    def _notes(
        self,
        original: tuple[ContextBlock, ...],
        final: tuple[ContextBlock, ...],
        duplicated: Sequence[tuple[ContextBlock, int]],
        rendered: Mapping[str, RegisteredBlock],
        relabeled: Mapping[str, str],
    ) -> tuple[str | None, str | None, int]:
        """The order note, the location note and their token count. The order note is
        left out only when the prompt read top to bottom (the blocks sent, then those
        the location note names, in its order) already follows the ranking: a
        de-duplicated block that outranks a sent one would otherwise lose its rank."""
        if not self.config.annotate:
            return None, None, 0
        templates = self.config.notes
        tokens = 0
        located = (block for block, _ in sorted(duplicated, key=operator.itemgetter(1)))
        order = order_note(original, (*final, *located), templates, relabeled)
        if order is not None:
            tokens += self._order_note_tokens(order, original, rendered, relabeled)
        location = location_note(duplicated, templates, relabeled)
        if location is not None:
            tokens += self.tokenizer.count(location + "\n\n")
        return order, location, tokens

    def _order_note_tokens(
        self,
        note: str,
        original: Sequence[ContextBlock],
        rendered: Mapping[str, RegisteredBlock],
        relabeled: Mapping[str, str],
    ) -> int:
        """The order note recurs with every reordering, so its tokens are summed from
        cached pieces (the template's, each label's) when every block shows the label
        its entry counted; counted afresh otherwise (a collision, or a de-duplicated
        block under the label of an earlier turn)."""
        entries = [rendered[block.id] for block in original]
        short = not relabeled and self.config.label_style == "short"  # entries: block.label
        if short or all(
            relabeled.get(block.id, block.label) == entry.label
            for block, entry in zip(original, entries, strict=True)
        ):
            template = self.config.notes.order.format(labels="") + "\n\n"
            return self._count_segment(template) + sum(entry.label_tokens for entry in entries)
        return self.tokenizer.count(note + "\n\n")

    # -- rendering --------------------------------------------------------------------

    def _render(
        self,
        layout: _Layout,
        rendered: dict[str, RegisteredBlock],
        request_id: str,
        conversation_id: str | None,
        matched: Sequence[str],
        *,
        reusable_tokens: int,
        blocks_start_tokens: int,
        tenant: str | None = None,
        cache_salt: str | None = None,
    ) -> Prompt:
        """``blocks_start_tokens``: tokens before this turn's first block (system
        prompt, history, context header)."""
        messages: list[dict[str, str]] = []
        head = self._system_head(layout.system_text)  # folded into the first user message
        if layout.system_text and not head:
            messages.append({"role": "system", "content": layout.system_text})
        for _, turn in layout.visible:
            messages.append({"role": "user", "content": head + turn.user_message})
            head = ""
            shown = self._shown_answer(turn)
            if shown is not None:
                messages.append({"role": "assistant", "content": shown.text})
        content, boundaries = self._render_user_message(
            layout, rendered, len(messages), blocks_start_tokens, head
        )
        messages.append({"role": "user", "content": content})
        split_specs = self._split_specs(layout) if self.config.cloud.enabled else ()
        end_tokens = boundaries[-1].token_end if boundaries else blocks_start_tokens
        tail_tokens = self._count_tail(layout)
        stats = PromptStats(
            blocks_total=len(layout.original),
            blocks_matched=len(matched),  # the search matches only this request's blocks
            blocks_deduplicated=len(layout.duplicated),
            reusable_tokens=reusable_tokens,
            prompt_tokens=end_tokens + tail_tokens,
            tail_tokens=tail_tokens,
        )
        return Prompt(
            messages=tuple(messages),
            blocks=layout.final,
            original_blocks=layout.original,
            deduplicated=tuple(block for block, _ in layout.duplicated),
            request_id=request_id,
            boundaries=tuple(boundaries),
            stats=stats,
            conversation_id=conversation_id,
            order_note=layout.order_note,
            location_note=layout.location_note,
            relabeled=MappingProxyType(layout.relabeled),
            history_lost=layout.history_lost,
            tenant=tenant,
            cache_salt=cache_salt,
            split_specs=split_specs,
        )

    def _split_specs(self, layout: _Layout) -> tuple[SplitSpec | None, ...]:
        """Per message, how its content blocks split
        (:func:`~contextpilot_rag.cloud.segments.split_user_message`): a history
        message splits as it did when it was sent."""
        specs: list[SplitSpec | None] = [None] if layout.system_text else []
        for _, turn in layout.visible:
            suffix = self._question_suffix(turn.question, escaped=False)
            specs.append(SplitSpec(turn.block_labels, self._lead_ins, suffix))
            if self._shown_answer(turn) is not None:
                specs.append(None)
        labels = tuple(layout.relabeled.get(block.id, block.label) for block in layout.final)
        suffix = self._question_suffix(layout.query, escaped=True)
        specs.append(SplitSpec(labels, self._lead_ins, suffix))
        return tuple(specs)

    def _question_suffix(self, query: str, *, escaped: bool) -> str:
        """The rendered question, which ends a user message; needed to find its tail
        only when the question template has no literal lead-in."""
        if self._lead_ins[-1]:
            return ""
        return self.config.question_template.format(
            query=query if escaped else self._guard.escape(query)
        )

    def _for_hosted_cache(
        self,
        prompt: Prompt,
        path: tuple[str, ...],
        fixed_tokens: tuple[int, ...],
        visible: Sequence[tuple[int, Turn]],
        keys: Mapping[str, str] | None,
        *,
        turn: int = 0,
        stored_key: str | None = None,
    ) -> tuple[Prompt, tuple[tuple[str, ...], ...]]:
        """``prompt`` with its cache plan and ``prompt_cache_key`` (``docs/cloud.md``),
        and the ledger keys of its breakpoints (recorded on commit). ``keys``: a
        tenant's blocks' registry keys (``None``: their ids); ``turn``: the turn's
        number in its conversation; ``stored_key``: the key its conversation keeps."""
        cloud = self.config.cloud
        if not cloud.enabled:
            return prompt, ()
        salt = prompt.cache_salt or ""

        def ledger_key(depth: int) -> tuple[str, ...]:
            # a system, tail or answer entry ends one prefix only while the history
            # window keeps every turn; one that drops a turn changes what comes before
            # a tail, so such a key carries a digest of the whole path before it
            last = path[depth - 1]
            if last.startswith("\x00"):
                return (salt, last, parts_digest(*path[: depth - 1]))
            return (salt, *path[:depth])

        now = self._clock()
        signals = IndexSignals(
            self._index if prompt.tenant is None else self._tenant_indexes.peek(prompt.tenant),
            path,
            since=now - cloud.ttl_s,
            limit=cloud.max_counted,
            shares=self._block_shares(prompt.blocks, keys),
            ledger=self._ledger,
            ledger_key=ledger_key,
            now=now,
            ttl_s=cloud.ttl_s,
        )
        shape = self._prompt_shape(prompt, path, fixed_tokens, visible)
        next_turn = cloud.next_turn_probability
        later: float | None = None
        if prompt.conversation_id is not None:
            if next_turn is None:
                next_turn = self._continuations.probability(turn, now)
                later = self._continuations.later_turns(turn, now)
            else:
                later = chained_turns(itertools.repeat(next_turn))
        new_system = self._system_reuse.probability(0, now)
        candidates = reuse_candidates(
            shape, signals, next_turn, new_system, later, cloud.rules.lookback_blocks or None
        )
        plan = plan_breakpoints(candidates, cloud.rules, model=cloud.model, ttl=cloud.ttl)
        cached = tuple(  # a marker the request moves off an unmarked role writes nothing new
            ledger_key(kept.candidate.index_depth)
            for kept in plan.breakpoints
            if kept.candidate.index_depth
            and prompt.messages[kept.candidate.message_index]["role"] not in plan.unmarked_roles
        )
        key = stored_key or self._cache_key(prompt, path, visible, now, shape.system_tokens)
        return replace(prompt, cache_plan=plan, prompt_cache_key=key), cached

    def _block_shares(
        self, blocks: Sequence[ContextBlock], keys: Mapping[str, str] | None
    ) -> list[float]:
        """Each block's share of the requests counted so far (its popularity). A block
        no request carried yet counts with the chance that a block seen anew comes back
        within the lifetime, spread over the requests a prefix's readers are counted
        among (``max_counted``); none before :data:`_BLOCK_REUSE_EVIDENCE` such blocks
        have come back or not."""
        counted = max(1, self._registry.requests_counted)
        now = self._clock()
        unseen = 0.0
        if self._block_reuse.resolved(0, now) >= _BLOCK_REUSE_EVIDENCE:
            unseen = self._block_reuse.probability(0, now) / self.config.cloud.max_counted
        ids = [block.id if keys is None else keys.get(block.id, block.id) for block in blocks]
        carried = [self._registry.popularity(i) for i in ids]
        return [count / counted if count else unseen for count in carried]

    def _prompt_shape(
        self,
        prompt: Prompt,
        path: tuple[str, ...],
        fixed_tokens: tuple[int, ...],
        visible: Sequence[tuple[int, Turn]],
    ) -> PromptShape:
        first = prompt.messages[0]
        system_tokens = self._count_segment(first["content"]) if first["role"] == "system" else 0
        header_tokens = self._count_segment(self.config.context_header)
        # each history turn's tail in the index path, and the content blocks after it:
        # its answer's, then each later turn's (its blocks, the first with the header,
        # and its tail)
        through = list(itertools.accumulate(fixed_tokens))
        depth_of = {key: depth for depth, key in enumerate(path[: len(fixed_tokens)], start=1)}
        turn_ends: list[tuple[int, int, int]] = []
        after = 0
        for _, turn in reversed(visible):
            after += self._shown_answer(turn) is not None
            depth = depth_of[turn.tail_id]
            turn_ends.append((depth, through[depth - 1], after))
            after += len(turn.block_ids) + 1
        return PromptShape(
            system_tokens=system_tokens,
            user_message_index=len(prompt.messages) - 1,
            history_tokens=max(0, sum(fixed_tokens) - header_tokens),
            turn_ends=tuple(turn_ends),
            block_ends=tuple(boundary.token_end for boundary in prompt.boundaries),
            prompt_tokens=prompt.stats.prompt_tokens,
            fixed_depth=len(fixed_tokens),
            earlier_turns=len(visible),
            conversation=prompt.conversation_id is not None,
            opening_message_index=1 if first["role"] == "system" else 0,
            # the first visible turn's blocks follow the system prompt's key in the path
            opening_blocks=tuple(
                (depth, through[depth - 1])
                for depth in range(2, 2 + (len(visible[0][1].block_ids) if visible else 0))
            ),
        )

    def _cache_key(
        self,
        prompt: Prompt,
        path: tuple[str, ...],
        visible: Sequence[tuple[int, Turn]],
        now: float,
        system_tokens: int,
    ) -> str:
        """A new ``prompt_cache_key``: per system prompt and the leading blocks the
        prompt starts with (a later turn's are its first visible turn's), or per system
        prompt alone where that reaches the model's minimum cacheable prefix (requests
        sharing only it then share its server rather than each taking one of its own),
        under the first variant whose route is not busy (``docs/cloud.md``). The
        leading blocks: ``key_blocks`` of them, or (``None``) those up to the first
        that reaches the minimum cacheable prefix: two requests that can read anything
        from each other share at least those, and requests that share fewer do not
        crowd one route (a later turn without a stored key: its first one)."""
        cloud = self.config.cloud
        least = cloud.rules.min_tokens(cloud.model)
        count = cloud.key_blocks
        if system_tokens and system_tokens >= least:
            count = 0  # the system prompt alone is worth one route
        elif count is None and not visible:
            ends = [boundary.token_end for boundary in prompt.boundaries]
            count = next((n + 1 for n, end in enumerate(ends) if end >= least), len(ends))
        if visible:
            leading = list(visible[0][1].block_ids[: 1 if count is None else count])
        else:
            leading = [block.id for block in prompt.blocks[:count]]
        return self._key_buckets.choose(prefix_cache_key(path[0], leading, prompt.cache_salt), now)

    def _render_user_message(
        self,
        layout: _Layout,
        rendered: dict[str, RegisteredBlock],
        message_index: int,
        start_tokens: int,
        head: str = "",
    ) -> tuple[str, list[BlockBoundary]]:
        """This turn's user message (``head``, the folded system prompt, first) and
        where its blocks sit."""
        header = self.config.context_header
        parts = [head, header]
        chars, tokens = len(head) + len(header), start_tokens
        boundaries = []
        new_boundary = tuple.__new__  # BlockBoundary(...) without its slow __new__
        for block in layout.final:
            entry = rendered[block.id]
            text = entry.rendered
            end_chars, end_tokens = chars + len(text), tokens + entry.tokens
            parts.append(text)
            boundaries.append(
                new_boundary(
                    BlockBoundary, (block.id, message_index, chars, end_chars, tokens, end_tokens)
                )
            )
            chars, tokens = end_chars, end_tokens
        parts.extend(
            note + "\n\n" for note in (layout.order_note, layout.location_note) if note is not None
        )
        parts.append(self.config.question_template.format(query=layout.query))  # escaped
        return "".join(parts), boundaries

    def _system_head(self, system_text: str | None) -> str:
        """What opens the first user message: with ``system_into_user``, the system
        prompt and a blank line; else nothing (the system prompt is its own message)."""
        if not (self.config.system_into_user and system_text):
            return ""
        return system_text + "\n\n"

    def _system_key(self, system_text: str) -> str:
        """Index key of the prompt head (system prompt and context header)."""
        key = self._system_keys.get(system_text)
        if key is None:
            folded = "\x00into-user" if self.config.system_into_user else ""
            key = "\x00sys:" + content_id(
                system_text + "\x00" + self.config.context_header + folded
            )
            self._system_keys.put(system_text, key)
        return key

    def _shown_answer(self, turn: Turn) -> _ShownAnswer | None:
        """The assistant message a history turn renders: its answer, or while it has
        none (or a blank one, which hosted APIs leave out with its message),
        ``PilotConfig.unanswered_text`` under an index key of its own, naming its text
        (an answer recorded later is other text, and so is another pilot's stand-in);
        ``None``: no assistant message."""
        answer, text = turn.answer, self.config.unanswered_text
        if answer is not None and (text is None or answer.strip()):
            return _ShownAnswer(answer, turn.answer_id, turn.answer_tokens)
        if text is None:
            return None
        key = f"\x00unanswered:{content_id(text)}:{turn.request_id}"
        return _ShownAnswer(text, key, self._count_segment(text))

    def _count_segment(self, text: str) -> int:
        """Token count of a recurring text (system prompt, header, note fragment,
        label), from a bounded cache."""
        if not text:
            return 0
        cached = self._segment_tokens.get(text)
        if cached is None:
            cached = self.tokenizer.count(text)
            self._segment_tokens.put(text, cached)
        return cached

    def _count_tail(self, layout: _Layout) -> int:
        """Tokens after the last block: the notes, then the question."""
        question = self.config.question_template.format(query=layout.query)
        return layout.note_tokens + self.tokenizer.count(question)

    # -- commit -----------------------------------------------------------------------

    def _stored(self, plan_turn: Callable[[], _Plan], plan: _Plan | None = None) -> _Plan:
        """``plan`` (else ``plan_turn()``) once its conversation's new record is
        written: a plan whose conversation changed since it was read is made again
        from the new record (lock held). Nothing else is changed here."""
        conversation_id = None
        for attempt in range(STORE_ATTEMPTS):
            if plan is None:
                plan = plan_turn()
            if self._store_turn(plan):
                return plan
            conversation_id, plan = plan.prompt.conversation_id, None
            self._back_off(attempt)
        raise _conflict(conversation_id or "")

    def _stored_batch(
        self, planned: Sequence[_Plan], batch: Sequence[BatchRequest], system: str | None
    ) -> list[_Plan]:
        """Every plan once its conversation's turn is written; when one fails, the turns
        this batch already wrote are taken back out before the error is raised (the
        caller gets no prompt for them)."""
        plans: list[_Plan] = []
        try:
            for plan in planned:
                plans.append(self._stored_batch_plan(plan, batch, system))
        except BaseException:
            self._take_back(plans)
            raise
        return plans

    def _take_back(self, plans: Sequence[_Plan]) -> None:
        """Undo the writes of ``plans``, latest first, as far as the store lets (a
        failure here is logged; the original error is what the caller sees). A record
        still as a plan wrote it goes back to the record the plan read (the turns a
        history window dropped included), or away when there was none; one another
        writer changed since only loses the plan's turn."""
        for plan in reversed(plans):
            if plan.conversation is None:
                continue
            request_id = plan.prompt.request_id
            try:
                self._take_back_turn(plan)
            except StoreError:
                logger.warning("could not take back turn %s of a failed batch", request_id)

    def _take_back_turn(self, plan: _Plan) -> None:
        assert plan.conversation is not None
        key, request_id = plan.conversation.conversation_id, plan.prompt.request_id
        for _ in range(STORE_ATTEMPTS):
            stored = self._store.get_versioned(key)
            if stored.conversation is None:
                return
            if stored.conversation == plan.conversation:  # as this plan wrote it
                if plan.previous is None:
                    self._store.delete(key)
                    return
                reverted = plan.previous
            else:
                reverted = stored.conversation.without_turn(request_id)
                if reverted == stored.conversation:
                    return
            if self._store.put_if_version(reverted, stored.version):
                return

    def _stored_batch_plan(
        self, plan: _Plan, batch: Sequence[BatchRequest], system: str | None
    ) -> _Plan:
        if plan.conversation is None:
            self._store_turn(plan)  # the index's checks only
            return plan
        index = plan.prompt.index
        assert index is not None
        return self._stored(
            functools.partial(self._plan_batch_turn, batch[index], system, index), plan
        )

    def _store_turn(self, plan: _Plan) -> bool:
        """Check that the plan can enter the index, then write its conversation's
        record if that is still at the version the plan read. False: another writer
        changed the conversation and nothing was written."""
        request_id = plan.prompt.request_id
        if plan.placements is None:
            self._index.check_insert(plan.index_path, plan.index_tokens, RequestId(request_id))
        else:
            for place in plan.placements:
                index = self._placement_index(place, create=False)
                if index is not None:
                    index.check_insert(place.path, place.tokens, RequestId(request_id))
        conversation = plan.conversation
        if conversation is None or self._store.put_if_version(conversation, plan.stored_version):
            return True
        # A write retried after a dropped connection may have been applied the first time.
        stored = self._store.get(conversation.conversation_id)
        return stored is not None and any(turn.request_id == request_id for turn in stored.turns)

    def _back_off(self, attempt: int) -> None:
        """After a conflict: writers that collided retry at random moments, so that
        one of them wins the next round (the first retry is immediate)."""
        if attempt:
            limit = min(_BACK_OFF_MAX_S, _BACK_OFF_S * 2 ** (attempt - 1))
            time.sleep(self._jitter.uniform(0, limit))

    def _record(self, plan: _Plan) -> None:
        """Commit a stored plan to the block registry and the context index."""
        request_id = RequestId(plan.prompt.request_id)
        untenanted = plan.prompt.tenant is None  # a tenant's orders use popularity alone
        self._registry.commit(plan.blocks, plan.entries, plan.keys, together=untenanted)
        if self.config.cloud.enabled:
            now = self._clock()
            for prefix in plan.cached_prefixes:
                self._ledger.record(prefix, now)
            # what a new system prompt's breakpoint and a new block's expect: whether one
            # seen anew is sent again within the lifetime
            salt = plan.prompt.cache_salt or ""
            if plan.prompt.messages[0]["role"] == "system":
                self._system_reuse.sighted((salt, plan.index_path[0]), now)
            for block_key in plan.keys or [block.id for block in plan.blocks]:  # as popularity
                self._block_reuse.sighted((salt, block_key), now)
            key = plan.prompt.prompt_cache_key
            if plan.conversation is None:
                if key is not None:
                    self._key_buckets.record(key, now)
            else:
                conversation = (plan.prompt.tenant, plan.conversation.conversation_id)
                turn = plan.conversation.turn_count - 1
                self._continuations.observe(conversation, turn, now)
                if key is not None:
                    # the route will also carry this conversation's next turn
                    returns = self._continuations.returns_within(turn, ROUTE_WINDOW_S, now)
                    self._key_buckets.record(
                        key,
                        now,
                        conversation=conversation,
                        returns=returns,
                        until=now + self._continuations.gap_quantile(_RETURN_QUANTILE),
                    )
        if plan.placements is None:
            self._index.insert(plan.index_path, plan.index_tokens, request_id)
        else:
            for place in plan.placements:
                index = self._placement_index(place, create=True)
                assert index is not None
                index.insert(place.path, place.tokens, request_id)
        self._remember(plan.prompt)

    def _placement_index(self, place: _Placement, *, create: bool) -> ContextIndex | None:
        if place.shared:
            return self._shared_index
        if create:
            return self._tenant_indexes.get(place.tenant)
        return self._tenant_indexes.peek(place.tenant)

    def _remember(self, prompt: Prompt) -> None:
        """Keep ``prompt``'s stats for :meth:`observe` by request id: the most recent
        ``max_observed_prompts`` only (lock held)."""
        capacity = self.config.max_observed_prompts
        if capacity:
            observed = self._observed
            observed[prompt.request_id] = (prompt.stats, prompt.tenant)
            if len(observed) > capacity:
                observed.popitem(last=False)


def pilot_on_store(config: PilotConfig | None, store: str) -> ContextPilot:
    """A pilot on the store at URL ``store``, checked to answer before any request (one
    read of a conversation nobody has): a store that is down, or holds records this
    version cannot read, is a :class:`ConfigError` naming it, its credentials redacted
    (the commands that open one answer it as a configuration error)."""
    try:
        pilot = ContextPilot(config, store=store)
        pilot.conversation(_STORE_PROBE)
    except UnknownConversationError:
        return pilot
    except StoreError as exc:
        raise ConfigError(
            f"the store {redacted(store)} does not answer, or cannot be read: {exc}"
        ) from None
    except ContextPilotError:
        raise
    except Exception as exc:  # a store client's own error
        raise ConfigError(f"the store {redacted(store)} does not answer: {exc!r}") from None
    return pilot


def structure_guard_of(pilot: ContextPilot | None) -> StructureGuard:
    """The escaping ``pilot`` renders untrusted text with (the default layout's for
    ``None``): what an adapter that re-renders blocks outside the pilot must use."""
    if pilot is None:
        return _default_guard()
    if not isinstance(pilot, ContextPilot):
        raise InvalidInputError(f"pilot must be a ContextPilot or None, got {type(pilot).__name__}")
    return pilot._guard


@functools.cache
def _default_guard() -> StructureGuard:
    return PilotConfig().structure_guard()


def _expired(conversation_id: str) -> ConversationExpiredError:
    return ConversationExpiredError(
        f"conversation {conversation_id!r} expired or was evicted from its store "
        "and its history is lost; call end_conversation() to start it again"
    )


def _conflict(conversation_id: str) -> ConversationConflictError:
    return ConversationConflictError(
        f"conversation {conversation_id!r} changed under this call {STORE_ATTEMPTS} times "
        "(other processes writing it); nothing was written: call again"
    )


def _index_sync(store: ConversationStore, config: IndexLogConfig) -> IndexSync | None:
    """The sharing of the context index through ``store``'s index log, if it has one
    and sharing is enabled (``docs/stores.md``)."""
    if not config.enabled:
        return None
    log = index_log_of(store, config.max_entries)
    return None if log is None else IndexSync(log, config)


def _index_record(plan: _Plan) -> IndexRecord:
    """What ``plan`` put into the indexes, for the store's index log."""
    placements: tuple[LoggedPlacement, ...]
    if plan.placements is None:
        placements = (LoggedPlacement("main", plan.index_path, plan.index_tokens),)
    else:
        placements = tuple(
            LoggedPlacement("shared" if place.shared else "tenant", place.path, place.tokens)
            for place in plan.placements
        )
    counted = plan.keys if plan.keys is not None else tuple(block.id for block in plan.blocks)
    return IndexRecord(plan.prompt.request_id, plan.prompt.tenant, placements, counted)


class _TextCache(Generic[_V]):
    """Values computed from recurring texts (system prompts, note fragments), bounded
    by entries and by the characters of the texts it keeps (long personalised system
    prompts would otherwise pin memory by count alone); emptied whole when either is
    reached, as the texts that recur come back at once. Lock: the pilot's."""

    def __init__(
        self, max_entries: int = _SEGMENT_CACHE_SIZE, max_chars: int = _SEGMENT_CACHE_CHARS
    ) -> None:
        self._values: dict[str, _V] = {}
        self._chars = 0
        self._max_entries, self._max_chars = max_entries, max_chars

    def get(self, text: str) -> _V | None:
        return self._values.get(text)

    def put(self, text: str, value: _V) -> None:
        if len(self._values) >= self._max_entries or self._chars + len(text) > self._max_chars:
            self._values.clear()
            self._chars = 0
        if len(text) <= self._max_chars:
            self._values[text] = value
            self._chars += len(text)

    @property
    def chars(self) -> int:
        return self._chars


def _fixed_entries(
    index: ContextIndex, request_id: RequestId, stats: PromptStats, shared: ContextIndex
) -> int:
    """How many entries of ``request_id``'s path in ``index`` come before its first
    context block (the system prompt, the history). A path in the shared index holds
    only the prompt's leading shared blocks (keyed by :func:`shared_key`), so there the
    count is found from the path itself; elsewhere the path is the whole prompt: the
    fixed entries, every block sent in full, the tail."""
    if index is shared:
        path = index.request_path(request_id)
        return next((n for n, key in enumerate(path) if key.startswith(SHARED_KEY_PREFIX)), 0)
    tokens = index.request_tokens(request_id)
    return max(0, len(tokens) - 1 - (stats.blocks_total - stats.blocks_deduplicated))


def _holds_answer(conversation: Conversation, request_id: str | None, answer: str) -> bool:
    """Whether turn ``request_id`` of ``conversation`` is answered with ``answer``;
    without ``request_id``, whether no turn awaits an answer and the latest one has
    this one (a retried write of an answer given by conversation id alone)."""
    if request_id is None:
        turns = conversation.turns
        return bool(turns) and turns[-1].answer == answer and not conversation.awaiting_answer()
    return any(
        turn.request_id == request_id and turn.answer == answer for turn in conversation.turns
    )


def _check_observed(prompt: object, method: str) -> None:
    if not isinstance(prompt, (Prompt, str)):
        raise InvalidInputError(
            f"{method}() takes the Prompt that was sent or its request id, "
            f"got {type(prompt).__name__}"
        )


def _check_conversation_id(conversation_id: object, tenant: str | None) -> None:
    """A conversation id is a non-empty str; without a tenant it may not have the
    form of a tenant's store key (it would reach that tenant's conversation)."""
    _check_text("conversation_id", conversation_id, allow_empty=False)
    assert isinstance(conversation_id, str)
    check_id_length("conversation_id", conversation_id, InvalidInputError)
    if tenant is None and is_tenant_key(conversation_id):
        raise InvalidInputError(
            "conversation_id starts with the reserved prefix of tenants' conversations "
            f"({conversation_id[:9]!r}); pass tenant= to continue a tenant's conversation"
        )


def _tenant_of(prompt: Prompt | str, tenant: str | None) -> str | None:
    """The tenant of a call about ``prompt``: the :class:`Prompt`'s own (``tenant``,
    if given, must be the same), else ``tenant`` (checked)."""
    if tenant is not None:
        check_tenant(tenant)
    if isinstance(prompt, Prompt):
        if tenant is not None and tenant != prompt.tenant:
            raise InvalidInputError("the prompt was built for another tenant than tenant=")
        return prompt.tenant
    return tenant


def _search(
    index: ContextIndex | None,
    blocks: Sequence[ContextBlock],
    fixed_prefix: tuple[str, ...],
    tokens_of: Mapping[str, int],
) -> MatchResult:
    """``index``'s best match for ``blocks`` after ``fixed_prefix`` (none without an
    index: a tenant with no prompt yet)."""
    if index is None:
        return MatchResult((), 0)
    wanted = [block.id for block in blocks]
    return index.search(wanted, fixed_prefix=fixed_prefix, token_counts=tokens_of)


def _check_text(name: str, value: object, *, allow_empty: bool = True) -> None:
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not allow_empty and not value:
        raise InvalidInputError(f"{name} must not be empty")
    check_encodable(name, value)


def _answer_target(prompt: Prompt | str, request_id: str | None) -> tuple[str, str | None]:
    """The conversation and turn an answer is for, from ``record_answer``'s arguments."""
    if isinstance(prompt, Prompt):
        if prompt.conversation_id is None:
            raise InvalidInputError(
                "record_answer() got a prompt of no conversation; pass conversation_id "
                "to optimize() for turns whose answers are history"
            )
        if request_id is not None and request_id != prompt.request_id:
            raise InvalidInputError("record_answer(): request_id differs from the prompt's")
        return prompt.conversation_id, prompt.request_id
    _check_text("conversation_id", prompt, allow_empty=False)
    if request_id is not None:
        _check_text("request_id", request_id, allow_empty=False)
    return prompt, request_id


def _relabeled(
    final: Sequence[ContextBlock],
    duplicated: Sequence[tuple[ContextBlock, int]],
    visible: Sequence[tuple[int, Turn]],
    registered: Mapping[str, RegisteredBlock] | None = None,
) -> dict[str, str]:
    """Block id → label, for the blocks that show another label than their
    :attr:`~ContextBlock.label`, so that labels are unique over the prompt and the
    history it renders: a de-duplicated block keeps the label its turn showed; a sent
    block keeps its own label unless another block already shows it. Its own label is
    the one its ``registered`` entry was rendered under (its id with
    ``label_style="id"``), or its :attr:`~ContextBlock.label` when ``registered`` is
    ``None`` (the default style, where they are the same). Usually empty then."""
    if registered is None:
        if not visible and len({block.label for block in final}) == len(final):
            return {}
        own = [block.label for block in final]
    else:
        own = [registered[block.id].label for block in final]
        if not visible and len(set(own)) == len(own):
            pairs = zip(final, own, strict=True)
            return {block.id: label for block, label in pairs if label != block.label}
    shown: dict[str, str] = {}
    taken: dict[str, str] = {}
    for _, turn in visible:
        for block_id, label in zip(turn.block_ids, turn.block_labels, strict=True):
            shown[block_id] = label
            taken[label] = block_id
    relabeled = {
        block.id: shown[block.id] for block, _ in duplicated if shown[block.id] != block.label
    }
    for block, own_label in zip(final, own, strict=True):
        label = unique_label(block, taken, own_label)
        taken[label] = block.id
        if label != block.label:
            relabeled[block.id] = label
    return relabeled


def _turn(
    prompt: Prompt,
    final: Sequence[ContextBlock],
    block_tokens: tuple[int, ...],
    query: str,
    head_chars: int,
) -> Turn:
    """The conversation's record of this turn; its user message without the system
    prompt folded into it (``head_chars`` characters), which a later prompt renders
    only where its history starts."""
    return Turn(
        request_id=prompt.request_id,
        user_message=prompt.messages[-1]["content"][head_chars:],
        block_ids=tuple(block.id for block in final),
        block_digests=tuple(block.digest for block in final),
        block_labels=tuple(prompt.relabeled.get(block.id, block.label) for block in final),
        block_tokens=block_tokens,
        question=query,
        tail_tokens=prompt.stats.tail_tokens,
    )


def _keys_by_id(
    blocks: Sequence[ContextBlock], keys: Sequence[str] | None
) -> dict[str, str] | None:
    """Block id → registry key, for a tenant's request (``None``: ids are the keys)."""
    if keys is None:
        return None
    return dict(zip((block.id for block in blocks), keys, strict=True))


def _pick_system(
    system: str | None, conversation: Conversation | None, default: str | None
) -> str | None:
    if system is not None:
        return system
    if conversation is not None and conversation.system is not None:
        return conversation.system
    return default
