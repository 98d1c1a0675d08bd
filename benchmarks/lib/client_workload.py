"""The workload of the client-overhead measurements (``client_overhead.py``,
``serve_workers.py``): prompts of a long shared system message, 36 of 200 long
documents drawn by ``seed`` and a question, and the engine's streamed answer."""

from __future__ import annotations

import random

__all__ = ["DOCS", "STREAM", "Messages", "prompts"]

Messages = list[dict[str, str]]

DOCS = [f"[doc{i}]\n" + f"Document {i} text about a topic. " * 60 for i in range(200)]
STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"ok"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":18000,"completion_tokens":1,'
    b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)


def prompts(count: int, seed: int = 0) -> list[Messages]:
    rng = random.Random(seed)
    system = {"role": "system", "content": "Answer from the documents. " * 20}
    return [
        [
            system,
            {"role": "user", "content": "\n\n".join(rng.sample(DOCS, 36))},
            {"role": "user", "content": f"Question {i}?"},
        ]
        for i in range(count)
    ]
