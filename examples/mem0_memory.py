"""Mem0 memories through ContextPilot, fully offline.

A mem0 ``Memory`` runs locally (FAISS in a temporary directory, a tiny hashing
embedder, memories stored with ``infer=False`` so no LLM is called). Wrapped in
``ContextPilotMemory``, each search returns the same memories as mem0, ordered so
that prompts share their prefix, with a note restoring mem0's ranking. The
prefix-cache model of ``contextpilot_rag.sim`` measures what an engine could reuse.

Run: ``python examples/mem0_memory.py`` (needs ``pip install -e integrations/mem0``)
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from typing import Any

os.environ["MEM0_TELEMETRY"] = "False"  # mem0 reads it at import time

from contextpilot_mem0 import ContextPilotMemory, format_memories
from mem0 import Memory
from mem0.embeddings.base import EmbeddingBase

from contextpilot_rag.sim import PrefixCacheModel
from contextpilot_rag.tokenizers import default_tokenizer

DIMS = 128
NOWHERE = "http://127.0.0.1:9/v1"  # nothing listens here: an LLM call would fail loudly
SYSTEM = "You are Alice's assistant. Use the memories below."

MEMORIES = [
    "Alice drinks green tea every morning and avoids coffee after noon. She brews it in a "
    "cast-iron pot her grandmother gave her.",
    "Alice lives in Lyon, France, in a small flat near the Saone river. She moved there "
    "from Grenoble six years ago.",
    "Alice's dog is a border collie called Rex who loves long walks in the park. Rex is "
    "four years old and afraid of thunder.",
    "Alice works as a night nurse at the Lyon university hospital. Her shifts run from "
    "eight in the evening to eight in the morning.",
    "Alice is allergic to peanuts and always carries an epinephrine pen. Restaurants must "
    "be told before she orders.",
    "Alice plays the cello in an amateur orchestra every Thursday evening. The orchestra "
    "rehearses in a church near her flat.",
    "Alice's favourite tea is jasmine green tea with a slice of lemon. She buys it loose "
    "from a shop in the old town.",
    "Alice is learning Japanese for a trip to Kyoto next spring. She studies with an app "
    "for twenty minutes on the tram.",
]
QUESTIONS = [
    "What tea does Alice drink in the morning?",
    "Which green tea would Alice like in Kyoto?",
    "Where does Alice live and work?",
    "What should a Lyon host know about Alice's tea and peanuts?",
    "Does Alice walk her dog in the morning before tea?",
    "What does Alice do on Thursday evenings in Lyon?",
]


class HashingEmbedder(EmbeddingBase):  # type: ignore[misc]
    """Offline, deterministic embeddings: hashed words, L2-normalised."""

    def embed(self, text: Any, memory_action: Any = None) -> list[float]:
        vector = [0.0] * DIMS
        vector[0] = 1.0
        for word in re.findall(r"[a-z0-9]+", str(text).lower()):
            digest = hashlib.sha256(word.encode()).digest()
            vector[1 + int.from_bytes(digest[:4], "big") % (DIMS - 1)] += 1.0
        norm = sum(x * x for x in vector) ** 0.5
        return [x / norm for x in vector]


def local_memory(directory: str) -> Any:
    """A mem0 Memory that never leaves the machine."""
    memory = Memory.from_config(
        {
            "vector_store": {
                "provider": "faiss",
                "config": {
                    "path": os.path.join(directory, "faiss"),
                    "collection_name": "example",
                    "embedding_model_dims": DIMS,
                    "distance_strategy": "cosine",
                },
            },
            "llm": {
                "provider": "openai",
                "config": {"model": "unused", "api_key": "unused", "openai_base_url": NOWHERE},
            },
            "embedder": {
                "provider": "openai",
                "config": {"embedding_dims": DIMS, "api_key": "unused", "openai_base_url": NOWHERE},
            },
            "history_db_path": os.path.join(directory, "history.db"),
        }
    )
    memory.embedding_model = HashingEmbedder()  # replaces the configured (remote) embedder
    return memory


def prompt_text(memories: str, question: str) -> str:
    return f"{SYSTEM}\n\n{memories}Question: {question}"


def main() -> dict[str, dict[str, float]]:
    tokenizer = default_tokenizer()
    plain_cache, pilot_cache = PrefixCacheModel(), PrefixCacheModel()
    with tempfile.TemporaryDirectory() as directory:
        raw = local_memory(directory)
        memory = ContextPilotMemory(raw)
        for text in MEMORIES:
            memory.add(text, user_id="alice", infer=False)  # passes through to mem0
        for question in QUESTIONS:
            found = memory.search(question, filters={"user_id": "alice"}, top_k=4)
            plain = raw.search(question, filters={"user_id": "alice"}, top_k=4)
            pilot_cache.admit(tokenizer.encode(prompt_text(format_memories(found), question)))
            plain_cache.admit(tokenizer.encode(prompt_text(format_memories(plain), question)))
            ranks = [result["contextpilot"]["rank"] for result in found["results"]]
            print(f"{question}\n  mem0 ranks in sent order: {ranks}")
        print("\nThe memories section of the last prompt:\n")
        print(format_memories(found))
    hit_ratio = {"mem0 order": plain_cache.hit_ratio, "contextpilot": pilot_cache.hit_ratio}
    print("prefix-cache hit ratio: " + ", ".join(f"{k} {v:.1%}" for k, v in hit_ratio.items()))
    return {"hit_ratio": hit_ratio}


if __name__ == "__main__":
    main()
