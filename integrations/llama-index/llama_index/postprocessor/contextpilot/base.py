"""The LlamaIndex node postprocessor: retrieved nodes in, the same nodes out, in the
order :meth:`ContextPilot.optimize` chose, annotated.

The adapter is thin: it turns each :class:`NodeWithScore` into a
:class:`~contextpilot_rag.ContextBlock` (id: the node id or ``metadata[id_key]``;
text: what LlamaIndex shows the LLM, escaped as the pilot escapes block text), lets the
pilot decide order, de-duplication and notes, and maps the result back onto copies of
the caller's nodes.

Invariant: every retrieved node comes back exactly once (exact repeats — same id,
same text — once, at their first position), with its score, and each node renders
to the same LLM text in every request (only the note carrier differs, after its
content), so the order the pilot chose becomes a shared token prefix in the engine.
A node's block is made from the node without this package's annotations, so nodes
it already annotated (``response.source_nodes`` fed back, two engines sharing one
pilot) are the same blocks as the raw nodes they came from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    Node,
    NodeWithScore,
    QueryBundle,
    TextNode,
)
from llama_index_instrumentation import get_dispatcher

from contextpilot_rag import ContextBlock, ContextPilot, Prompt
from contextpilot_rag.errors import (
    ConfigError,
    InvalidBlockError,
    InvalidInputError,
)
from contextpilot_rag.escaping import StructureGuard
from contextpilot_rag.pilot import structure_guard_of

__all__ = [
    "ANNOTATION_KEYS",
    "DEDUPLICATED_KEY",
    "HISTORY_LOST_KEY",
    "LABEL_KEY",
    "MATCHED_KEY",
    "NOTES_KEY",
    "RANK_KEY",
    "REQUEST_ID_KEY",
    "ContextPilotNodePostprocessor",
    "ContextPilotPromptEvent",
]

logger = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

LABEL_KEY = "contextpilot_label"
"""The label the pilot's notes cite the node by (:meth:`Prompt.label_of`, unique in
the prompt); shown to the LLM when ``annotate``."""
RANK_KEY = "contextpilot_rank"
"""0-based position of the node in the retriever's order (0 = most relevant)."""
MATCHED_KEY = "contextpilot_matched"
"""``True`` when the node is in the prefix an earlier prompt already sent (cached)."""
REQUEST_ID_KEY = "contextpilot_request_id"
"""The pilot prompt's request id (what :meth:`ContextPilot.observe` and
:meth:`ContextPilot.evict` take); also announced as a :class:`ContextPilotPromptEvent`."""
NOTES_KEY = "contextpilot_notes"
"""The request's order / location notes (``""`` when there are none)."""
DEDUPLICATED_KEY = "contextpilot_deduplicated"
"""``True`` when the node was already sent in an earlier turn of ``conversation_id``."""
HISTORY_LOST_KEY = "contextpilot_history_lost"
"""``True`` when ``conversation_id``'s conversation had expired or been evicted, so this
turn started it again without its history (:attr:`Prompt.history_lost`)."""
ANNOTATION_KEYS = (
    LABEL_KEY,
    RANK_KEY,
    MATCHED_KEY,
    DEDUPLICATED_KEY,
    HISTORY_LOST_KEY,
    NOTES_KEY,
    REQUEST_ID_KEY,
)
_TEMPLATE_KEY = "contextpilot_text_template"
"""On the notes carrier only: its ``text_template`` before the notes were appended."""
_OWN_KEYS = (*ANNOTATION_KEYS, _TEMPLATE_KEY)


class ContextPilotPromptEvent(BaseEvent):
    """The postprocessor returned the nodes of the pilot prompt ``request_id``, built by
    ``pilot``: dispatched from inside the postprocessing span, so that
    :class:`~llama_index.postprocessor.contextpilot.ContextPilotEventHandler` can pair
    it with the LLM call of the same query."""

    request_id: str
    pilot: ContextPilot = Field(exclude=True, repr=False)

    @classmethod
    def class_name(cls) -> str:
        return "ContextPilotPromptEvent"


class ContextPilotNodePostprocessor(BaseNodePostprocessor):
    """Reorders retrieved nodes so that prompts share cached prefixes, and annotates
    them, through a shared :class:`~contextpilot_rag.ContextPilot`.

    Returns new :class:`NodeWithScore` objects (shallow copies of the nodes with
    fresh ``metadata``; the caller's nodes are never modified), scores kept. Each
    carries :data:`ANNOTATION_KEYS` in ``metadata``, all hidden from the embedding
    view and, except :data:`LABEL_KEY` when ``annotate``, from the LLM view. A copy's
    text and the metadata values the LLM sees are escaped as the pilot escapes block
    text (control tokens broken, lines imitating a label, a note or the question
    escaped), so the LLM view is the text the pilot rendered for the block. Nodes it
    returned may come back to it (``response.source_nodes`` reused, two engines on
    one pilot): their annotations are replaced, never stacked, and they are the same
    blocks as the raw nodes.

    ``annotate``: each node shows its label to the LLM, and the pilot's notes
    (relevance ranking, blocks of earlier turns) follow the content of the last node
    the pilot sends in full (through that copy's ``text_template``). ``dedup``: flag
    nodes already sent in ``conversation_id``'s earlier turns (:data:`DEDUPLICATED_KEY`)
    and move them after the others; they are never dropped. It is off by default
    because dropping (or relying on) a flagged node is safe only when the prompt
    still contains the earlier turns' nodes, and LlamaIndex's chat engines rebuild
    the context every turn and keep only the messages (see
    docs/integrations/llama-index.md). ``conversation_id`` is the conversation key of
    the whole library (the pilot, the Mem0 adapter, the serve API); ``session_id``,
    its earlier name here, is still accepted as a constructor keyword and an
    attribute, and giving both with different values is a
    :class:`~contextpilot_rag.errors.ConfigError`. ``id_key``:
    take block ids from this metadata key instead of the node id. Works without a
    query (the order never depends on the query text). Each call announces its
    prompt's request id as a :class:`ContextPilotPromptEvent` on LlamaIndex's
    dispatcher, for :class:`ContextPilotEventHandler` to pair with the LLM call.
    """

    pilot: ContextPilot = Field(
        default_factory=ContextPilot,
        exclude=True,
        description="Owns the context index: share one per process (per engine).",
    )
    conversation_id: str | None = Field(
        default=None, description="Conversation to dedup in (alias: session_id); needs dedup."
    )
    dedup: bool = Field(default=False, description="Flag (never drop) nodes sent in earlier turns.")
    annotate: bool = Field(
        default=True, description="Show labels and the pilot's notes to the LLM."
    )
    id_key: str | None = Field(
        default=None, description="Metadata key holding the block id (default: node id)."
    )

    def __init__(self, **data: Any) -> None:
        super().__init__(**_with_conversation_id(data))
        self._check_options()  # here, not in a validator: pydantic would wrap ConfigError

    @property
    def session_id(self) -> str | None:
        """The earlier name of :attr:`conversation_id` (reads and sets it)."""
        return self.conversation_id

    @session_id.setter
    def session_id(self, value: str | None) -> None:
        self.conversation_id = value

    def _check_options(self) -> None:
        if self.dedup and not self.conversation_id:
            raise ConfigError("dedup=True needs a conversation_id (the conversation to dedup in)")
        if self.conversation_id is not None and not self.dedup:
            raise ConfigError(
                "conversation_id is used only for dedup: set dedup=True or leave it unset"
            )
        if self.id_key is not None and not self.id_key:
            raise ConfigError("id_key must be a non-empty metadata key or None")

    @classmethod
    def class_name(cls) -> str:
        return "ContextPilotNodePostprocessor"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        return self._optimize(nodes, query_bundle)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        # Off the event loop: tokenizing new nodes takes a while, and a pilot on a shared
        # store waits for its round trips. The thread copies the context, so the prompt
        # event still reaches the dispatcher under the caller's span.
        return await asyncio.to_thread(self._optimize, nodes, query_bundle)

    def _optimize(
        self, nodes: Sequence[NodeWithScore], query_bundle: QueryBundle | None
    ) -> list[NodeWithScore]:
        self._check_options()  # fields may have been reassigned since __init__
        query = _query_text(query_bundle)
        items = [_without_annotations(item) for item in _checked(nodes)]
        guard = _guard_of(self.pilot)
        escaped = [_escaped(position, item, guard) for position, item in enumerate(items)]
        blocks = [
            self._block_of(position, item, shown)
            for position, (item, shown) in enumerate(zip(items, escaped, strict=True))
        ]
        if not blocks:
            if self.dedup and self.conversation_id is not None:
                # a retrieval with no hit is still a turn: the pilot's history window
                # counts it, as the application's chat history does
                self.pilot.optimize([], query, conversation_id=self.conversation_id)
            return []
        prompt = self.pilot.optimize(
            blocks, query, conversation_id=self.conversation_id if self.dedup else None
        )
        logger.debug(
            "%s: %d nodes, %d matched, %d deduplicated",
            prompt.request_id,
            prompt.stats.blocks_total,
            prompt.stats.blocks_matched,
            prompt.stats.blocks_deduplicated,
        )
        dispatcher.event(ContextPilotPromptEvent(request_id=prompt.request_id, pilot=self.pilot))
        first_of: dict[str, NodeWithScore] = {}
        for block, shown in zip(blocks, escaped, strict=True):
            first_of.setdefault(block.id, shown)
        return self._annotated(prompt, first_of, "\n\n".join(prompt.notes))

    def _block_of(self, position: int, item: NodeWithScore, shown: NodeWithScore) -> ContextBlock:
        """The block for one node: the LLM view of its escaped copy ``shown`` as
        text (the pilot's escaping leaves it as it is), so that one id with two
        renderings is the core's ``BlockConflictError``."""
        return ContextBlock(
            shown.node.get_content(metadata_mode=MetadataMode.LLM),
            id=self._id_of(position, item),
            score=item.score,
        )

    def _id_of(self, position: int, item: NodeWithScore) -> str:
        if self.id_key is None:
            return item.node.node_id
        value = item.node.metadata.get(self.id_key)
        if not isinstance(value, str) or not value:
            raise InvalidBlockError(
                f"nodes[{position}] ({item.node.node_id!r}) has no non-empty str "
                f"metadata[{self.id_key!r}] to use as its id (id_key={self.id_key!r})"
            )
        return value

    def _annotated(
        self, prompt: Prompt, first_of: dict[str, NodeWithScore], notes: str
    ) -> list[NodeWithScore]:
        """Copies of the nodes: first those the pilot sends in full, in its order,
        then those it de-duplicated, in retrieval order. The notes follow the last
        node sent in full (or the last node, when every one was de-duplicated)."""
        ranks = {block.id: rank for rank, block in enumerate(prompt.original_blocks)}
        matched, flagged = prompt.matched_ids, prompt.deduplicated_ids
        carrier = (prompt.blocks or prompt.deduplicated)[-1].id
        return [
            _annotated_copy(
                first_of[block.id],
                {
                    LABEL_KEY: prompt.label_of(block.id),
                    RANK_KEY: ranks[block.id],
                    MATCHED_KEY: block.id in matched,
                    DEDUPLICATED_KEY: block.id in flagged,
                    HISTORY_LOST_KEY: prompt.history_lost,
                    NOTES_KEY: notes,
                    REQUEST_ID_KEY: prompt.request_id,
                },
                visible_note=notes if self.annotate and block.id == carrier else "",
                show_label=self.annotate,
            )
            for block in prompt.placed_blocks
        ]


def _with_conversation_id(data: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor keywords with ``session_id`` (the earlier name) given as
    ``conversation_id``. Raises :class:`ConfigError` when both are given and differ."""
    options = dict(data)
    if "session_id" not in options:
        return options
    alias = options.pop("session_id")
    given = options.get("conversation_id")
    if "conversation_id" in options and given != alias:
        raise ConfigError(
            f"conversation_id={given!r} and session_id={alias!r} name two conversations; "
            "session_id is the earlier name of conversation_id: give only conversation_id"
        )
    options["conversation_id"] = alias
    return options


def _query_text(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        return ""
    if not isinstance(query_bundle, QueryBundle):
        raise InvalidInputError(
            f"query_bundle must be a QueryBundle or None, got {type(query_bundle).__name__}"
        )
    return query_bundle.query_str


def _checked(nodes: object) -> list[NodeWithScore]:
    """``nodes`` as a list of text-capable :class:`NodeWithScore` (``TextNode`` and
    ``Node`` families: the ones with a ``text_template`` to carry the notes)."""
    if not isinstance(nodes, (list, tuple)):
        raise InvalidInputError(
            f"nodes must be a list of NodeWithScore, got {type(nodes).__name__}"
        )
    for position, item in enumerate(nodes):
        if not isinstance(item, NodeWithScore):
            raise InvalidInputError(
                f"nodes[{position}] is {type(item).__name__}, expected NodeWithScore"
            )
        if not isinstance(item.node, (TextNode, Node)):
            raise InvalidBlockError(
                f"nodes[{position}] is a {type(item.node).__name__}; "
                "ContextPilotNodePostprocessor handles TextNode and Node subclasses"
            )
    return list(nodes)


def _without_annotations(item: NodeWithScore) -> NodeWithScore:
    """``item`` as it was before this package annotated it (``item`` itself when it
    carries no annotation): the annotation keys gone from its metadata and exclusion
    lists, the ``text_template`` it had before the notes restored. Its LLM view is
    then the text the pilot registered for the raw node, so an annotated node is
    never a second text for the same id."""
    node = item.node
    if not any(key in node.metadata for key in _OWN_KEYS):
        return item
    update: dict[str, Any] = {
        "metadata": {k: v for k, v in node.metadata.items() if k not in _OWN_KEYS},
        "excluded_llm_metadata_keys": _without(node.excluded_llm_metadata_keys, _OWN_KEYS),
        "excluded_embed_metadata_keys": _without(node.excluded_embed_metadata_keys, _OWN_KEYS),
    }
    template = node.metadata.get(_TEMPLATE_KEY)
    if isinstance(template, str):
        update["text_template"] = template
    return NodeWithScore(node=node.model_copy(update=update), score=item.score)


def _guard_of(pilot: ContextPilot) -> StructureGuard:
    """The pilot's escaping, plus the line LlamaIndex shows the label on
    (``contextpilot_label: ...``), which a node's text must not imitate either."""
    return structure_guard_of(pilot).with_lead_ins(f"{LABEL_KEY}:")


def _escaped(position: int, item: NodeWithScore, guard: StructureGuard) -> NodeWithScore:
    """``item`` with its text and the metadata values its LLM view shows escaped by
    ``guard`` (a copy only when that changes something). Escaping works line by line,
    so the LLM view of the copy is the node's view escaped, and escaping it again
    changes nothing: the pilot renders exactly this text. Metadata keys and
    templates are the application's and are left as they are."""
    node = item.node
    text = _text_of(position, node)
    update = _escaped_metadata(node, guard)
    escaped = guard.escape(text)
    if escaped != text:
        update.update(_with_text(node, escaped))
    if not update:
        return item
    return NodeWithScore(node=node.model_copy(update=update), score=item.score)


def _text_of(position: int, node: BaseNode) -> str:
    text = node.get_content(metadata_mode=MetadataMode.NONE)
    if not text.strip():
        raise InvalidBlockError(
            f"nodes[{position}] ({type(node).__name__} {node.node_id!r}) has no text; "
            "ContextPilotNodePostprocessor orders text context only: give the node a "
            "text (e.g. an image caption) or filter such nodes out before it"
        )
    return text


def _escaped_metadata(node: BaseNode, guard: StructureGuard) -> dict[str, Any]:
    hidden = set(node.excluded_llm_metadata_keys)
    changed = {
        key: escaped
        for key, value in node.metadata.items()
        if key not in hidden and (escaped := guard.escape(str(value))) != str(value)
    }
    return {"metadata": {**node.metadata, **changed}} if changed else {}


def _with_text(node: BaseNode, text: str) -> dict[str, Any]:
    if isinstance(node, Node) and node.text_resource is not None:  # Node keeps text apart
        return {"text_resource": node.text_resource.model_copy(update={"text": text})}
    return {"text": text}


def _annotated_copy(
    item: NodeWithScore, annotations: dict[str, Any], *, visible_note: str, show_label: bool
) -> NodeWithScore:
    """A copy of ``item`` (not annotated) with ``annotations`` in fresh metadata (label
    first, so it reads like the pilot's ``[label]`` header), hidden from the views that
    must not change, and ``visible_note`` appended to the ``text_template``: after the
    content wherever metadata is rendered (LLM view; the embedding view too, which
    nothing downstream of retrieval re-embeds). The carrier keeps its template as it
    was under a hidden key, for :func:`_without_annotations`."""
    node = item.node
    metadata = {LABEL_KEY: annotations[LABEL_KEY], **node.metadata, **annotations}
    update: dict[str, Any] = {}
    if visible_note and isinstance(node, (TextNode, Node)):  # _checked() made sure
        escaped = visible_note.replace("{", "{{").replace("}", "}}")
        update["text_template"] = f"{node.text_template}\n\n{escaped}"
        metadata[_TEMPLATE_KEY] = node.text_template
    hidden = [key for key in _OWN_KEYS if key in metadata]
    hidden_from_llm = [key for key in hidden if not (show_label and key == LABEL_KEY)]
    update |= {
        "metadata": metadata,
        "excluded_llm_metadata_keys": _extended(node.excluded_llm_metadata_keys, hidden_from_llm),
        "excluded_embed_metadata_keys": _extended(node.excluded_embed_metadata_keys, hidden),
    }
    return NodeWithScore(node=node.model_copy(update=update), score=item.score)


def _extended(keys: Sequence[str], more: Sequence[str]) -> list[str]:
    return [*keys, *(key for key in more if key not in keys)]


def _without(keys: Sequence[str], dropped: Sequence[str]) -> list[str]:
    return [key for key in keys if key not in dropped]
