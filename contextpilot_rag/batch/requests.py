"""Validation of a batch's requests, all of it before any work or state change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..blocks import ContextBlock, is_list_like, validate_blocks
from ..errors import (
    BlockConflictError,
    DuplicateRequestError,
    EmptyContextError,
    InvalidInputError,
)
from ..tenants import check_tenant, registry_key

__all__ = ["BatchRequest", "validate_batch"]


class BatchRequest(NamedTuple):
    """One request of a batch: its blocks (retrieval order), the question, and
    optionally the conversation and the tenant it belongs to."""

    blocks: Sequence[ContextBlock]
    query: str
    conversation_id: str | None = None
    tenant: str | None = None


def validate_batch(requests: object) -> list[BatchRequest]:
    """The requests as :class:`BatchRequest` with validated, de-repeated blocks.
    Raises :class:`EmptyContextError` (empty batch, a request without blocks),
    :class:`InvalidInputError` (wrong shapes or types, a bad tenant, a tenant's
    conversation twice),
    :class:`BlockConflictError` (one id, two texts anywhere in the batch, within a
    tenant's requests or the requests without one: tenants' ids never meet) or
    :class:`DuplicateRequestError` (the same request twice)."""
    if not is_list_like(requests):
        raise InvalidInputError(
            f"requests must be a list of (blocks, query) pairs, got {type(requests).__name__}"
        )
    batch = [_request(position, request) for position, request in enumerate(requests)]
    if not batch:
        raise EmptyContextError("empty batch: pass at least one (blocks, query) request")
    texts: dict[str, tuple[str, int]] = {}
    seen_requests: dict[tuple[tuple[str, ...], str, str | None, str | None], int] = {}
    conversations: dict[tuple[str | None, str], int] = {}
    for position, request in enumerate(batch):
        for block in request.blocks:
            # a tenant's ids are its own (as online): keyed as the block registry keys them
            key_of = block.id if request.tenant is None else registry_key(request.tenant, block)
            known = texts.setdefault(key_of, (block.text, position))
            if known[0] != block.text:
                raise BlockConflictError(
                    f"block id {block.id!r} has different texts in requests {known[1]} "
                    f"and {position}"
                )
        ids = tuple(block.id for block in request.blocks)
        key = (ids, request.query, request.conversation_id, request.tenant)
        first = seen_requests.setdefault(key, position)
        if first != position:
            raise DuplicateRequestError(
                f"requests {first} and {position} are identical (same blocks, query and "
                "conversation); send it once and reuse the prompt"
            )
        if request.conversation_id is not None:
            conversation = (request.tenant, request.conversation_id)
            earlier = conversations.setdefault(conversation, position)
            if earlier != position:
                raise InvalidInputError(
                    f"conversation {request.conversation_id!r} appears in requests {earlier} "
                    f"and {position}; a conversation's turns need the answers in between, "
                    "so send one turn per batch"
                )
    return batch


def _request(position: int, request: object) -> BatchRequest:
    if isinstance(request, BatchRequest):
        parts: tuple[object, ...] = tuple(request)
    elif isinstance(request, (tuple, list)) and len(request) in (2, 3, 4):
        parts = tuple(request)
    else:
        raise InvalidInputError(
            f"requests[{position}] must be a (blocks, query), (blocks, query, "
            f"conversation_id) or (blocks, query, conversation_id, tenant) tuple, "
            f"got {type(request).__name__}"
        )
    blocks, query = parts[0], parts[1]
    conversation_id = parts[2] if len(parts) >= 3 else None
    tenant = parts[3] if len(parts) == 4 else None
    try:
        unique = validate_blocks(blocks)
    except (EmptyContextError, InvalidInputError, BlockConflictError) as exc:
        raise type(exc)(f"requests[{position}]: {exc}") from exc
    if not isinstance(query, str):
        raise InvalidInputError(f"requests[{position}]: query must be a str")
    if conversation_id is not None and (
        not isinstance(conversation_id, str) or not conversation_id
    ):
        raise InvalidInputError(f"requests[{position}]: conversation_id must be a non-empty str")
    if tenant is not None:
        tenant = check_tenant(tenant, f"requests[{position}].tenant")
    return BatchRequest(unique, query, conversation_id, tenant)
