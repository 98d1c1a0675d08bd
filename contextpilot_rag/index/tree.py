"""The online context index: a radix tree of the block sequences already sent.

Invariant: the path from the root to a node spells a block sequence that some sent
prompt started with; every node's path is a prefix of each child's path. A node's
``edge`` holds the blocks between its parent and itself; children are keyed by the
first block of their edge (the inverted map ``block → child``), so a search looks up
only the request's own blocks at each node and costs O(k · depth), independent of how
many contexts are indexed.

The index mirrors an engine's prefix cache without any help from the engine: the
token total of all edges stays under ``capacity_tokens`` and the node count under
``max_nodes`` by evicting least-recently-used leaves (as SGLang's radix cache and
vLLM's block pool do), and nodes idle longer than ``ttl_s`` are dropped. When the
engine does report evictions, :meth:`ContextIndex.evict` prunes by request id.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NewType

from .._numbers import is_int, is_number
from ..errors import ConfigError, DuplicateRequestError, InvalidInputError
from .distance import DEFAULT_ALPHA, context_distance

__all__ = ["ContextIndex", "IndexConfig", "IndexStats", "MatchResult", "RequestId"]

RequestId = NewType("RequestId", str)


@dataclass(frozen=True)
class IndexConfig:
    """Bounds and tuning of a :class:`ContextIndex`.

    ``capacity_tokens`` should match the engine's prefix-cache size (KV blocks ×
    block size); ``None`` disables that bound. ``search_budget`` caps the nodes a
    search may expand. ``alpha`` weighs the position term of eq. 1.
    """

    capacity_tokens: int | None = 2_000_000
    max_nodes: int | None = 200_000
    ttl_s: float | None = None
    alpha: float = DEFAULT_ALPHA
    search_budget: int = 16

    def __post_init__(self) -> None:
        for name in ("capacity_tokens", "max_nodes"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and value >= 1):
                raise ConfigError(f"IndexConfig.{name} must be a positive int or None")
        if self.ttl_s is not None and not (is_number(self.ttl_s) and 0 < self.ttl_s < math.inf):
            raise ConfigError("IndexConfig.ttl_s must be a finite number > 0, or None")
        if not (is_number(self.alpha) and 0 <= self.alpha < 1):
            raise ConfigError("IndexConfig.alpha must be in [0, 1)")
        if not (is_int(self.search_budget) and self.search_budget >= 1):
            raise ConfigError("IndexConfig.search_budget must be an int >= 1")


@dataclass(frozen=True)
class MatchResult:
    """The longest indexed prefix a request can reuse.

    ``blocks`` are the matched block ids in cached order (the fixed prefix first),
    ``tokens`` their token total; :attr:`distance` is eq. 1 between the request and
    the indexed path the match lies on (1.0 when nothing matched), computed on first
    access."""

    blocks: tuple[str, ...]
    tokens: int
    request: tuple[str, ...] = field(default=(), repr=False, compare=False)
    indexed_path: tuple[str, ...] = field(default=(), repr=False, compare=False)
    alpha: float = field(default=DEFAULT_ALPHA, repr=False, compare=False)

    @functools.cached_property
    def distance(self) -> float:
        if not self.blocks:
            return 1.0
        return context_distance(self.request, self.indexed_path, self.alpha)


@dataclass(frozen=True)
class IndexStats:
    nodes: int
    tokens: int
    requests: int
    evicted_nodes: int


class _Node:
    __slots__ = (
        "alive",
        "children",
        "edge",
        "edge_tokens",
        "edge_total",
        "full_path",
        "last_access",
        "parent",
        "request_ids",
        "tick",
    )

    def __init__(
        self, parent: _Node | None, edge: tuple[str, ...], edge_tokens: tuple[int, ...]
    ) -> None:
        self.parent = parent
        self.edge = edge
        self.edge_tokens = edge_tokens
        self.edge_total = sum(edge_tokens)
        self.full_path: tuple[str, ...] | None = None
        self.children: dict[str, _Node] = {}
        self.request_ids: set[RequestId] = set()
        self.tick = 0
        self.last_access = 0.0
        self.alive = True

    def __lt__(self, other: _Node) -> bool:
        # Only to order (tokens, tick, node) entries; siblings never share a tick.
        return self.tick < other.tick

    def path(self) -> tuple[str, ...]:
        """The blocks from the root to here. A live node's path never changes (a split
        above it shortens its edge but keeps the sequence), so it is cached."""
        if self.full_path is None:
            parts: list[tuple[str, ...]] = []
            node: _Node | None = self
            while node is not None:
                parts.append(node.edge)
                node = node.parent
            self.full_path = tuple(itertools.chain.from_iterable(reversed(parts)))
        return self.full_path


class ContextIndex:
    """Radix tree over block-id sequences with LRU/TTL bounds. Not thread-safe by
    itself: :class:`~contextpilot_rag.ContextPilot` serialises access."""

    def __init__(
        self, config: IndexConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or IndexConfig()
        self._clock = clock
        self._root = _Node(None, (), ())
        self._by_request: dict[RequestId, _Node] = {}
        self._leaf_heap: list[tuple[int, int, _Node]] = []
        self._ticks = itertools.count(1)
        self._heap_seq = itertools.count()
        self._tokens = 0
        self._nodes = 0
        self._evicted_nodes = 0

    # -- queries ---------------------------------------------------------------------

    def stats(self) -> IndexStats:
        return IndexStats(self._nodes, self._tokens, len(self._by_request), self._evicted_nodes)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_request

    def request_path(self, request_id: RequestId) -> tuple[str, ...]:
        """The block sequence indexed for ``request_id``."""
        return self._by_request[request_id].path()

    def request_tokens(self, request_id: RequestId) -> tuple[int, ...]:
        """The token count of each block of ``request_id``'s path."""
        parts: list[tuple[int, ...]] = []
        node: _Node | None = self._by_request[request_id]
        while node is not None:
            parts.append(node.edge_tokens)
            node = node.parent
        return tuple(itertools.chain.from_iterable(reversed(parts)))

    def requests_sharing(self, request_id: RequestId, depth: int) -> list[RequestId]:
        """The other requests whose paths share the first ``depth`` blocks of
        ``request_id``'s path (``[]`` if it is unknown or ``depth`` < 1)."""
        node = self._by_request.get(request_id)
        if node is None or depth < 1:
            return []
        depth = min(depth, len(node.path()))
        while node.parent is not None and len(node.parent.path()) >= depth:
            node = node.parent  # the highest node whose path still covers depth blocks
        found: list[RequestId] = []
        stack = [node]
        while stack:
            current = stack.pop()
            found += [r for r in current.request_ids if r != request_id]
            stack += current.children.values()
        return found

    def recent_sharing(
        self, prefix: Sequence[str], since: float, *, limit: int = 32, budget: int = 256
    ) -> int:
        """How many indexed requests whose path starts with ``prefix`` were indexed (or
        had their node passed by a later insert) at or after ``since``: at most
        ``limit``, counted over at most ``budget`` nodes. A node is never touched later
        than its parent, so older subtrees are skipped whole. Changes nothing."""
        node, _, matched, _ = self._walk_fixed(prefix)
        if not prefix or len(matched) < len(prefix):
            return 0
        count, stack = 0, [node]
        while stack and budget > 0 and count < limit:
            current = stack.pop()
            budget -= 1
            if current.last_access >= since:
                count += len(current.request_ids)
                stack.extend(current.children.values())
        return min(count, limit)

    def search(
        self,
        blocks: Iterable[str],
        *,
        fixed_prefix: Sequence[str] = (),
        token_counts: Mapping[str, int] | None = None,
    ) -> MatchResult:
        """Alg. 1, adapted to prefix reuse: the longest indexed path that starts with
        ``fixed_prefix`` (matched in order: system prompt, conversation history) and
        continues with blocks from ``blocks`` in any order. Ties go to the most
        recently used path. ``token_counts`` (block → tokens) lets the search prune
        branches that cannot beat the best match so far. Changes nothing."""
        node, offset, matched, tokens = self._walk_fixed(fixed_prefix)
        if len(matched) < len(fixed_prefix):
            return MatchResult(tuple(matched), tokens)
        order = list(blocks)
        request = (*fixed_prefix, *order)
        wanted = set(order).difference(fixed_prefix)
        ttl = self.config.ttl_s
        since = None if ttl is None else self._clock() - ttl  # idler paths are expired
        if since is not None and node.last_access < since:
            return self._result(request, tuple(matched), tokens, node)
        if offset < len(node.edge):  # the fixed prefix ends inside an edge
            run = _leading_run(node.edge[offset:], wanted)
            matched.extend(node.edge[offset : offset + run])
            tokens += sum(node.edge_tokens[offset : offset + run])
            if offset + run < len(node.edge):
                return self._result(request, tuple(matched), tokens, node)
            wanted = wanted.difference(node.edge)
        bound = None if token_counts is None else sum(map(token_counts.__getitem__, wanted))
        tip, run, path_tokens = self._best_descent(node, wanted, tokens, bound, since)
        if tip is node:
            return self._result(request, tuple(matched), tokens, node)
        assert tip.parent is not None
        above = tip.parent.path()
        path = (*above, *tip.edge[:run])
        return MatchResult(path, path_tokens, request, (*above, *tip.edge), self.config.alpha)

    def _result(
        self, request: tuple[str, ...], path: tuple[str, ...], tokens: int, tip: _Node
    ) -> MatchResult:
        indexed = tip.path() if path else ()
        return MatchResult(path, tokens, request, indexed, self.config.alpha)

    def _walk_fixed(self, prefix: Sequence[str]) -> tuple[_Node, int, list[str], int]:
        """Follow ``prefix`` exactly; return the deepest node reached, how many of its
        edge blocks were matched, and the matched blocks and tokens."""
        node, tokens = self._root, 0
        matched: list[str] = []
        while len(matched) < len(prefix):
            child = node.children.get(prefix[len(matched)])
            if child is None:
                return node, len(node.edge), matched, tokens
            for offset, (block, block_tokens) in enumerate(
                zip(child.edge, child.edge_tokens, strict=True)
            ):
                if len(matched) == len(prefix) or prefix[len(matched)] != block:
                    return child, offset, matched, tokens
                matched.append(block)
                tokens += block_tokens
            node = child
        return node, len(node.edge), matched, tokens

    def _best_descent(
        self,
        start: _Node,
        wanted: set[str],
        tokens: int,
        wanted_tokens: int | None,
        since: float | None,
    ) -> tuple[_Node, int, int]:
        """Depth-first, most promising child first, within ``search_budget`` node
        expansions; stops early once the best match holds every wanted token
        (``wanted_tokens``, if known). Returns the tip node, how many of its edge
        blocks matched, and the matched tokens. Below the fixed prefix a path never
        repeats a block, so ``wanted`` needs no shrinking on the way down. A node last
        used before ``since`` (``ttl_s`` ago) has expired, though the next insert has
        not yet dropped it: it is skipped. (Hot path: kept flat on purpose.)"""
        best_node, best_run, best_tokens, best_tick = start, len(start.edge), tokens, start.tick
        everything = None if wanted_tokens is None else tokens + wanted_tokens
        stack = [(start, tokens)]
        budget = self.config.search_budget
        n_wanted = len(wanted)
        while stack and budget > 0:
            if everything is not None and best_tokens >= everything:
                break
            node, path_tokens = stack.pop()
            budget -= 1
            children = node.children
            if len(children) <= n_wanted:
                candidates = [child for block, child in children.items() if block in wanted]
            else:
                candidates = [children[block] for block in wanted if block in children]
            if since is not None:
                candidates = [child for child in candidates if child.last_access >= since]
            deeper: list[tuple[int, int, _Node]] = []
            for child in candidates:
                edge = child.edge
                run = 0
                for block in edge:
                    if block not in wanted:
                        break
                    run += 1
                if run == len(edge):
                    total = path_tokens + child.edge_total
                    if child.children:
                        deeper.append((total, child.tick, child))
                else:
                    total = path_tokens + sum(child.edge_tokens[:run])
                if total > best_tokens or (total == best_tokens and child.tick > best_tick):
                    best_node, best_run, best_tokens, best_tick = child, run, total, child.tick
            if deeper:
                deeper.sort()  # best last, so it is expanded next
                for total, _, child in deeper:
                    stack.append((child, total))
        return best_node, best_run, best_tokens

    # -- updates ---------------------------------------------------------------------

    def insert(
        self, path: Sequence[str], token_counts: Sequence[int], request_id: RequestId
    ) -> None:
        """Alg. 2 step 3: record that ``request_id`` was sent with blocks in ``path``
        order, then evict to the configured bounds."""
        self.check_insert(path, token_counts, request_id)
        self._insert_checked(path, token_counts, request_id)

    def _insert_checked(
        self, path: Sequence[str], token_counts: Sequence[int], request_id: RequestId
    ) -> None:
        now, tick = self._clock(), next(self._ticks)
        node = self._insert_path(tuple(path), tuple(token_counts), now, tick)
        node.request_ids.add(request_id)
        self._by_request[request_id] = node
        self._expire(now)
        self._enforce_bounds()

    def check_insert(
        self, path: Sequence[str], token_counts: Sequence[int], request_id: RequestId
    ) -> None:
        """Raise the error :meth:`insert` would raise, without changing anything."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidInputError("request_id must be a non-empty str")
        if request_id in self._by_request:
            raise DuplicateRequestError(f"request id {request_id!r} is already indexed")
        if not path:
            raise InvalidInputError("cannot index an empty block path")
        if len(path) != len(token_counts):
            raise InvalidInputError("path and token_counts differ in length")

    def _insert_path(
        self, path: tuple[str, ...], tokens: tuple[int, ...], now: float, tick: int
    ) -> _Node:
        node, position = self._root, 0
        self._touch(node, now, tick)
        while position < len(path):
            child = node.children.get(path[position])
            if child is None:
                return self._add_leaf(node, path[position:], tokens[position:], now, tick)
            common = _common_length(child.edge, path, position)
            if common < len(child.edge):
                child = self._split(child, common)
            node, position = child, position + common
            self._touch(node, now, tick)
        return node

    def _add_leaf(
        self,
        parent: _Node,
        edge: tuple[str, ...],
        edge_tokens: tuple[int, ...],
        now: float,
        tick: int,
    ) -> _Node:
        leaf = _Node(parent, edge, edge_tokens)
        parent.children[edge[0]] = leaf
        self._nodes += 1
        self._tokens += leaf.edge_total
        self._touch(leaf, now, tick)
        return leaf

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut ``child``'s edge after ``at`` blocks; return the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(parent, child.edge[:at], child.edge_tokens[:at])
        upper.tick, upper.last_access = child.tick, child.last_access
        parent.children[upper.edge[0]] = upper
        child.parent = upper
        child.edge, child.edge_tokens = child.edge[at:], child.edge_tokens[at:]
        child.edge_total -= upper.edge_total
        upper.children[child.edge[0]] = child
        self._nodes += 1
        return upper

    def _touch(self, node: _Node, now: float, tick: int) -> None:
        node.tick, node.last_access = tick, now
        if not node.children and node is not self._root:
            self._push_leaf(node)

    def evict(self, request_ids: Iterable[RequestId]) -> int:
        """Forget these requests (the engine evicted them); prune nodes left without
        requests or children, in O(depth) each. Unknown ids are ignored. Returns how
        many requests were removed."""
        if isinstance(request_ids, str):
            raise InvalidInputError("evict() takes a list of request ids, not one string")
        ids = list(request_ids)
        removed = 0
        for request_id in ids:
            node = self._by_request.pop(request_id, None)
            if node is None:
                continue
            removed += 1
            node.request_ids.discard(request_id)
            self._prune_upward(node)
        return removed

    def _prune_upward(self, node: _Node) -> None:
        while node is not self._root and not node.children and not node.request_ids:
            parent = node.parent
            assert parent is not None
            self._remove_leaf(node)
            node = parent
        if node is not self._root and not node.children:
            self._push_leaf(node)

    def _push_leaf(self, node: _Node) -> None:
        """Queue ``node`` for LRU eviction at its current tick. Entries it had queued
        before are stale (skipped when popped); compacting here, not only when the
        bounds evict, keeps the heap within a constant factor of the live nodes even
        when nothing ever exceeds a bound (engine evictions, no capacity set)."""
        heapq.heappush(self._leaf_heap, (node.tick, next(self._heap_seq), node))
        self._compact_heap()

    def _remove_leaf(self, node: _Node) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[node.edge[0]]
        node.alive = False
        node.parent = None
        self._nodes -= 1
        self._tokens -= node.edge_total
        self._evicted_nodes += 1

    def _over_bounds(self) -> bool:
        cap, max_nodes = self.config.capacity_tokens, self.config.max_nodes
        return (cap is not None and self._tokens > cap) or (
            max_nodes is not None and self._nodes > max_nodes
        )

    def _enforce_bounds(self) -> None:
        while self._over_bounds():
            leaf = self._pop_lru_leaf()
            if leaf is None:
                return
            self._evict_leaf(leaf)

    def _expire(self, now: float) -> None:
        ttl = self.config.ttl_s
        if ttl is None:
            return
        while self._leaf_heap:
            leaf = self._peek_lru_leaf()
            if leaf is None or now - leaf.last_access <= ttl:
                return
            heapq.heappop(self._leaf_heap)
            self._evict_leaf(leaf)

    def _peek_lru_leaf(self) -> _Node | None:
        heap = self._leaf_heap
        while heap:
            tick, _, node = heap[0]
            if node.alive and not node.children and node.tick == tick:
                return node
            heapq.heappop(heap)
        return None

    def _pop_lru_leaf(self) -> _Node | None:
        node = self._peek_lru_leaf()
        if node is not None:
            heapq.heappop(self._leaf_heap)
        self._compact_heap()
        return node

    def _compact_heap(self) -> None:
        if len(self._leaf_heap) > 4 * self._nodes + 1024:
            self._leaf_heap = [
                entry
                for entry in self._leaf_heap
                if entry[2].alive and not entry[2].children and entry[2].tick == entry[0]
            ]
            heapq.heapify(self._leaf_heap)

    def _evict_leaf(self, leaf: _Node) -> None:
        for request_id in leaf.request_ids:
            del self._by_request[request_id]
        leaf.request_ids.clear()
        parent = leaf.parent
        assert parent is not None
        self._remove_leaf(leaf)
        self._prune_upward_after_lru(parent)

    def _prune_upward_after_lru(self, node: _Node) -> None:
        if node is not self._root and not node.children:
            self._push_leaf(node)


def _leading_run(edge: tuple[str, ...], wanted: set[str]) -> int:
    if len(edge) == 1:
        return 1 if edge[0] in wanted else 0
    run = 0
    for block in edge:
        if block not in wanted:
            break
        run += 1
    return run


def _common_length(edge: tuple[str, ...], path: tuple[str, ...], start: int) -> int:
    common = 0
    limit = min(len(edge), len(path) - start)
    while common < limit and edge[common] == path[start + common]:
        common += 1
    return common
