"""Adapters that let external routers run under our :class:`~.types.Policy` protocol.

:class:`GorgoLbPolicy` wraps the original GORGO implementation (the optional package
``gorgo-lb``, imported as ``gorgo``) so benchmarks compare against it, not a re-creation.
GORGO indexes *token ids* in a radix trie; a :class:`~.types.RouteRequest` carries
chained block hashes, so each block is expanded to ``block_tokens`` synthetic token ids
(its hash; equal prefixes → equal token prefixes, which is all the trie
needs). Like the original proxy, the wrapper inserts every dispatched prompt into the
trie; the trie has no eviction, so its memory grows with the traffic it has seen.
"""

from __future__ import annotations

import importlib
from itertools import chain, repeat
from typing import Any

from .common import candidate_replicas
from .types import Decision, FleetView, Outcome, RouteRequest

__all__ = ["GorgoLbPolicy", "block_token_ids"]

_TOKEN_MASK = 0xFFFFFFFF


def block_token_ids(block_hashes: tuple[int, ...], block_tokens: int) -> list[int]:
    """Synthetic uint32 token ids: each block's (chained, so prefix-unique) hash repeated
    ``block_tokens`` times — cheap to build, so the comparison times GORGO, not this."""
    return list(chain.from_iterable(repeat(h & _TOKEN_MASK, block_tokens) for h in block_hashes))


def _import_gorgo() -> Any:
    try:
        return importlib.import_module("gorgo")
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the 'gorgo-lb' policy needs the optional package gorgo-lb; "
            "install it with `pip install gorgo-lb`"
        ) from exc


class GorgoLbPolicy:
    """The ``gorgo-lb`` package's policy (default its ``gorgo`` cost router) as a Policy.

    ``hyperparameters``: flat GORGO weights (``rtt_weight``, ``prefill_weight``,
    ``load_weight``) over the package defaults."""

    name = "gorgo-lb"
    route_memory = None  # the package's trie is unbounded: no prompt bound to tell it

    def __init__(
        self, policy: str = "gorgo", hyperparameters: dict[str, float] | None = None
    ) -> None:
        gorgo = _import_gorgo()
        self._gorgo = gorgo
        self._route = gorgo.get_policy(policy).fn
        self.trie = gorgo.RadixTrie()
        self._store: dict[str, Any] = gorgo.make_default_store()
        self._store["defaults"].update(hyperparameters or {})

    def choose(self, request: RouteRequest, fleet: FleetView) -> Decision:
        """Build GORGO's RouteContext from the fleet view, route, insert into the trie."""
        candidates = candidate_replicas(request, fleet)
        by_id = {r.replica_id: r for r in candidates}
        token_ids = block_token_ids(request.block_hashes, request.block_tokens)
        context = self._gorgo.RouteContext(
            replica_urls=list(by_id),
            metrics={
                r.replica_id: self._gorgo.ReplicaSnapshot(
                    num_running_reqs=r.in_flight,
                    num_queue_reqs=0,
                    num_used_tokens=0,
                    latency=r.rtt_s,
                    network_rtt=r.rtt_s,
                )
                for r in candidates
            },
            endpoints_queued_tokens={r.replica_id: r.queued_tokens for r in candidates},
            endpoints_queued_uncached_tokens={r.replica_id: r.queued_tokens for r in candidates},
            endpoints_inflight_requests={r.replica_id: r.in_flight for r in candidates},
            radix_trie=self.trie,
            token_ids=token_ids,
            request_tokens=request.prompt_tokens,
            hyperparameters=self._store,
            affinity_key=request.session,
        )
        result = self._route(context)
        chosen = by_id[result.target]
        if token_ids:
            self.trie.insert(token_ids, endpoint=chosen.replica_id)
        reason = "gorgo-lb" if result.fallback_reason is None else result.fallback_reason
        return Decision(chosen.replica_id, chosen.model, reason)

    def observe(self, outcome: Outcome) -> None:
        """GORGO learns only from dispatches (its trie); outcomes are not used."""
