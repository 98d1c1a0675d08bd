"""Quickstart: reorder, de-duplicate and annotate retrieved context, fully offline.

Two users ask about overlapping documents that their retriever returns in different
orders; one of them asks a follow-up in the same conversation. The prefix-cache model
of ``contextpilot_rag.sim`` stands in for the engine and reports how many prompt
tokens it could serve from cache, with and without the pilot.

Run: ``python examples/quickstart.py``
"""

from __future__ import annotations

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, Prompt
from contextpilot_rag.sim import PrefixCacheModel
from contextpilot_rag.tokenizers import default_tokenizer

CORPUS = {
    "eiffel": "The Eiffel Tower was completed in 1889 for the World's Fair in Paris. " * 6,
    "louvre": "The Louvre is the world's most-visited museum, home of the Mona Lisa. " * 6,
    "seine": "The Seine flows 777 km through Paris before reaching the English Channel. " * 6,
    "metro": "The Paris Metro opened in 1900 and has sixteen numbered lines today. " * 6,
    "notre": "Notre-Dame cathedral reopened in December 2024 after the 2019 fire. " * 6,
}

# (conversation, question, retrieved document ids, most relevant first)
REQUESTS = [
    ("alice", "When was the Eiffel Tower built?", ["eiffel", "seine", "louvre"]),
    ("bob", "What is in the Louvre?", ["louvre", "eiffel", "seine", "metro"]),
    ("alice", "And how long is the Seine?", ["seine", "metro", "eiffel"]),
    ("carol", "How do I get around Paris?", ["metro", "seine", "louvre", "notre"]),
]


def retrieve(doc_ids: list[str]) -> list[ContextBlock]:
    return [ContextBlock(CORPUS[doc_id], id=doc_id) for doc_id in doc_ids]


def main() -> dict[str, float]:
    tokenizer = default_tokenizer()
    pilot = ContextPilot(tokenizer=tokenizer)
    # What an application without the pilot sends: same layout, retrieval order,
    # no de-duplication, no notes.
    unmodified = ContextPilot(
        PilotConfig(reorder=False, dedup=False, annotate=False), tokenizer=tokenizer
    )
    baseline_cache, pilot_cache = PrefixCacheModel(), PrefixCacheModel()
    last: Prompt | None = None
    for conversation, question, doc_ids in REQUESTS:
        blocks = retrieve(doc_ids)
        baseline = unmodified.optimize(blocks, question, conversation_id=conversation)
        baseline_cache.admit(tokenizer.encode(baseline.text))
        prompt = pilot.optimize(blocks, question, conversation_id=conversation)
        pilot_cache.admit(tokenizer.encode(prompt.text))
        # A real application sends prompt.to_openai() to its engine here.
        answer = f"(answer to: {question})"
        unmodified.record_answer(baseline, answer)
        pilot.record_answer(prompt, answer)
        print(
            f"{conversation:>6}: order {[b.id for b in prompt.blocks]}, "
            f"deduplicated {[b.id for b in prompt.deduplicated]}, "
            f"{prompt.stats.blocks_matched} blocks matched"
        )
        last = prompt
    assert last is not None
    content = last.messages[-1]["content"]
    print("\nEnd of the last prompt, after its blocks:\n")
    print(content[last.boundaries[-1].char_end :])
    ratios = {
        "unmodified": baseline_cache.hit_ratio,
        "contextpilot_rag": pilot_cache.hit_ratio,
    }
    print("\nprefix-cache hit ratio: " + ", ".join(f"{k} {v:.1%}" for k, v in ratios.items()))
    return ratios


if __name__ == "__main__":
    main()
