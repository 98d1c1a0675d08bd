"""mem0 search results ↔ context blocks.

mem0 2.x ``search`` returns ``{"results": [{"id", "memory", "score", ...}, ...]}`` (and
more top-level keys with some configurations, e.g. ``"relations"`` with a graph
store). Each result with a non-blank ``memory`` becomes one :class:`ContextBlock`; the
pilot's :class:`Prompt` decides their order; the response is rebuilt from *copies* of
mem0's dictionaries, so the objects mem0 returned are never changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeGuard

from contextpilot_rag import ContextBlock, Prompt, content_id

from ._errors import Mem0ResponseError

__all__ = [
    "ANNOTATION_KEY",
    "MemoryBlocks",
    "memory_block_id",
    "read_response",
    "rebuild_response",
    "result_block",
]

ANNOTATION_KEY = "contextpilot"
"""The key under which the response and each of its results carry the annotations."""

Status = Literal["sent", "deduplicated", "skipped"]

_ID_HASH_CHARS = 8
_NOTE_END = "\n\n"  # the core ends every note with a blank line


def memory_block_id(memory_id: str, text: str) -> str:
    """The block id of a memory: its mem0 id, ``:``, 8 hex digits of its text's hash.

    The core rejects one block id with two texts, and a mem0 memory keeps its id when
    ``update`` changes its text: the hash makes each version of a memory its own block."""
    return f"{memory_id}:{content_id(text)[:_ID_HASH_CHARS]}"


@dataclass(frozen=True)
class MemoryBlocks:
    """A search response read for the pilot. ``block_ids[i]`` is the block id of
    ``results[i]``, ``None`` when that result is skipped (blank ``memory``, or a repeat
    of an earlier result with the same id and text); ``blocks`` are the others, in
    mem0's order."""

    response: Mapping[str, Any]
    results: tuple[Mapping[str, Any], ...]
    block_ids: tuple[str | None, ...]
    blocks: tuple[ContextBlock, ...]


def read_response(response: object) -> MemoryBlocks:
    """Read a mem0 2.x search response; :class:`Mem0ResponseError` if it is not one."""
    results: object = response.get("results") if isinstance(response, Mapping) else None
    if not isinstance(response, Mapping) or not _is_list(results):
        raise Mem0ResponseError(
            "expected the mem0 2.x search response {'results': [...]}, got "
            f"{_describe(response)}; upgrade mem0ai to >= 2.2"
        )
    checked = tuple(_as_result(result, position) for position, result in enumerate(results))
    block_ids: list[str | None] = []
    blocks: list[ContextBlock] = []
    seen: set[str] = set()
    for position, result in enumerate(checked):
        block = result_block(result, position)
        if block is None or block.id in seen:
            block_ids.append(None)
        else:
            seen.add(block.id)
            block_ids.append(block.id)
            blocks.append(block)
    return MemoryBlocks(response, checked, tuple(block_ids), tuple(blocks))


def result_block(result: object, position: int) -> ContextBlock | None:
    """The block of one search result; ``None`` when its ``memory`` is blank."""
    result = _as_result(result, position)
    text, memory_id = result.get("memory"), result.get("id")
    if not isinstance(text, str):
        raise Mem0ResponseError(f"results[{position}]['memory'] is {_describe(text)}, not a str")
    if isinstance(memory_id, bool) or not isinstance(memory_id, (str, int)) or memory_id == "":
        raise Mem0ResponseError(
            f"results[{position}]['id'] is {_describe(memory_id)}, not a non-empty str"
        )
    if not text.strip():
        return None
    score = result.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        score = None
    return ContextBlock(text, id=memory_block_id(str(memory_id), text), score=score)


def rebuild_response(
    read: MemoryBlocks,
    prompt: Prompt | None,
    *,
    conversation_id: str | None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """A copy of the response whose results follow the prompt, each annotated.
    ``prompt`` is ``None`` when no result had text outside a conversation (nothing
    was optimized); ``tenant``:
    the one the conversation is kept under."""
    placed = _placement(read, prompt)
    results = [
        {
            **read.results[rank],
            ANNOTATION_KEY: {
                "rank": rank,
                "moved": rank != position,
                "status": status,
                "label": label,
            },
        }
        for position, (rank, status, label) in enumerate(placed)
    ]
    summary = _summary(prompt) if prompt is not None else _empty_summary()
    summary["conversation_id"] = conversation_id
    summary["tenant"] = tenant
    return {**read.response, "results": results, ANNOTATION_KEY: summary}


def _placement(read: MemoryBlocks, prompt: Prompt | None) -> list[tuple[int, Status, str | None]]:
    """``(rank in mem0's results, status, label)`` in the returned order: memories sent
    in full (prompt order), then de-duplicated ones, then skipped ones (mem0's order)."""
    rank_of = {block_id: rank for rank, block_id in enumerate(read.block_ids) if block_id}
    placed: list[tuple[int, Status, str | None]] = []
    if prompt is not None:
        deduplicated = prompt.deduplicated_ids
        placed += [
            (
                rank_of[block.id],
                "deduplicated" if block.id in deduplicated else "sent",
                prompt.label_of(block.id),
            )
            for block in prompt.placed_blocks
        ]
    skipped = [rank for rank, block_id in enumerate(read.block_ids) if block_id is None]
    return placed + [(rank, "skipped", None) for rank in skipped]


def _summary(prompt: Prompt) -> dict[str, Any]:
    return {
        "request_id": prompt.request_id,
        "order_note": prompt.order_note,
        "location_note": prompt.location_note,
        "notes": list(prompt.notes),
        "messages": prompt.to_openai(),
        "stats": asdict(prompt.stats),
        "history_lost": prompt.history_lost,
    }


def _empty_summary() -> dict[str, Any]:
    return {
        "request_id": None,
        "order_note": None,
        "location_note": None,
        "notes": [],
        "messages": [],
        "stats": None,
        "history_lost": False,
    }


def _as_result(result: object, position: int) -> Mapping[str, Any]:
    if not isinstance(result, Mapping):
        raise Mem0ResponseError(f"results[{position}] is {_describe(result)}, expected a dict")
    return result


def _is_list(value: object) -> TypeGuard[Sequence[object]]:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
