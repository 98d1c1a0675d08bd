"""A client of ``contextpilot-rag serve``, the OpenAI-compatible proxy, in plain OpenAI
SDK code: the documents travel in ``extra_body={"contextpilot": {...}}``.

Offline by default: two loopback engines with a simulated prefix cache and the proxy in
front of them start in this process (``BackgroundServer``). Against a proxy you run::

    contextpilot-rag serve --endpoint http://127.0.0.1:8000/v1 --model MODEL
    python examples/serve_client.py --base-url http://127.0.0.1:8040/v1 --model MODEL

Any language works the same way: add the ``contextpilot`` object to the JSON body.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import openai

from contextpilot_rag.serve import BackgroundServer, ServeConfig
from contextpilot_rag.testing import SAMPLE_CORPUS, OpenAICompatibleServer

# (question, ids of the documents the retriever returned, most relevant first)
TURNS = [
    ("When was the Eiffel Tower built?", ["eiffel", "seine", "louvre"]),
    ("And what does the Louvre hold?", ["louvre", "metro", "eiffel"]),
]


@contextlib.contextmanager
def offline_proxy() -> Iterator[tuple[str, str]]:
    """Two loopback engines and the proxy in front of them: (base URL, model)."""
    with OpenAICompatibleServer() as first, OpenAICompatibleServer() as second:
        config = ServeConfig(endpoints=(first.base_url, second.base_url), model=first.model)
        with BackgroundServer(config) as proxy:
            yield proxy.base_url, first.model


def documents(ids: list[str]) -> list[dict[str, Any]]:
    """What a retriever returned, as the ``contextpilot`` field takes it."""
    return [{"id": doc_id, "text": SAMPLE_CORPUS[doc_id]} for doc_id in ids]


def cached(usage: Any) -> str:
    """The engine's prompt tokens and how many it served from its prefix cache."""
    details = usage.prompt_tokens_details
    hit = details.cached_tokens if details is not None else "?"
    return f"{usage.prompt_tokens} prompt tokens, {hit} cached"


def converse(base_url: str, model: str, api_key: str) -> list[dict[str, Any]]:
    """Two turns of one conversation, the second streamed; returns each turn's
    ``contextpilot`` response object."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    question, ids = TURNS[0]
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        extra_body={"contextpilot": {"documents": documents(ids), "conversation_id": "demo"}},
    )
    extensions = [(answer.model_extra or {})["contextpilot"]]
    print(f"turn 1: {answer.choices[0].message.content}")
    print(f"        {extensions[0]['blocks_sent']} documents sent; {cached(answer.usage)}")
    question, ids = TURNS[1]
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"contextpilot": {"documents": documents(ids), "conversation_id": "demo"}},
    )
    text, usage = [], None
    for chunk in stream:
        if "contextpilot" in (chunk.model_extra or {}):
            extensions.append((chunk.model_extra or {})["contextpilot"])
        text += [choice.delta.content or "" for choice in chunk.choices]
        usage = chunk.usage or usage
    print(f"turn 2: {''.join(text)}")
    print(
        f"        {extensions[1]['blocks_deduplicated']} documents already in the "
        f"conversation (a location note instead); {cached(usage)}"
    )
    client.close()
    return extensions


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="a running proxy's /v1 URL (default: offline)")
    parser.add_argument("--model", default="test-model", help="with --base-url: the model")
    parser.add_argument("--api-key", default="unused", help="with --base-url: the proxy's key")
    args = parser.parse_args(argv)
    if args.base_url:
        return converse(args.base_url, args.model, args.api_key)
    with offline_proxy() as (base_url, model):
        return converse(base_url, model, "unused")


if __name__ == "__main__":
    main()
