"""Route keys of LiteLLM requests: the chained prefix hashes a policy matches routes by
(:mod:`contextpilot_rag.routing.prompt_keys`), from the request's chat messages.

Boundaries are the ends of messages and, for a request the hook built, the ends of its
context blocks (the hook stamps them in the metadata: ``[message index, character
end]`` pairs), so requests that share documents meet on one replica even when their
messages differ. The keys are the core's (:class:`PromptKeys`, as the
``RoutingClient`` derives them), salted as the core salts them
(:func:`~contextpilot_rag.routing.prompt_keys.route_salt`) with the request's
tenant: a tenant's request can never match a route another tenant's prompt left (and
so never learn, from where it is sent, what another tenant has cached). The one
exception is a *public* prompt the hook sent unsalted to engines that take salts
(``ContextPilotHook(send_cache_salt=True)``, ``docs/tenants.md``): it is one cache
entry for every tenant, so its keys are every tenant's too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextpilot_rag.errors import InvalidInputError
from contextpilot_rag.routing import RouteRequest
from contextpilot_rag.routing.prompt_keys import (
    ChatTemplate,
    PromptKeys,
    PromptText,
    chat_template,
    serialise,
)

__all__ = ["PLAIN_TEMPLATE", "RouteKeys", "route_namespace"]

PLAIN_TEMPLATE = ChatTemplate("plain", "<|{role}|>\n{content}", "\n")
"""``<|role|>\\n{content}\\n`` per message: how the route keys render messages when the
engines' chat template is not named (the core's default rendering)."""

_EMPTY = PromptText("", ())


def route_namespace(tenant: str | None, *, public: bool = False) -> str | None:
    """The salt of a request's route keys: its tenant's namespace; none (every
    tenant's) without a tenant, or for a ``public`` prompt (sent unsalted to engines
    that take salts, so cached once for all tenants)."""
    if tenant is None or public:
        return None
    return f"tenant\x1f{tenant}"


class RouteKeys:
    """Builds :class:`RouteRequest` objects for LiteLLM requests. Not thread-safe: the
    strategy serialises calls (``observe_tokens`` refines an estimate)."""

    def __init__(
        self,
        *,
        block_tokens: int = 16,
        chars_per_token: float = 4.0,
        template: str | ChatTemplate | None = None,
    ) -> None:
        self.template = chat_template(template) or PLAIN_TEMPLATE
        self._keys = PromptKeys(block_tokens=block_tokens, chars_per_token=chars_per_token)

    def text(self, messages: object, input: object, block_ends: object = None) -> PromptText:
        """The routing text of a request: its messages (with the hook's block ends),
        else an embedding's string input; nothing to match for anything else."""
        if isinstance(messages, Sequence) and not isinstance(messages, str) and messages:
            try:
                text = serialise(messages, self.template)
            except InvalidInputError:
                return _EMPTY
            extra = self._block_positions(messages, block_ends)
            if extra:
                return PromptText(
                    text.text, tuple(sorted({*text.boundaries, *extra})), text.messages
                )
            return text
        if isinstance(input, str) and input:
            return serialise(input)
        return _EMPTY

    def _block_positions(self, messages: Sequence[Any], block_ends: object) -> list[int]:
        """Character positions (in the rendered text) of the block ends the hook stamped."""
        if not isinstance(block_ends, list) or not block_ends:
            return []
        if not all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in messages):
            return []
        _, starts, _ = self.template.render(
            [{"role": str(m["role"]), "content": m["content"]} for m in messages]
        )
        positions = []
        for pair in block_ends:
            if isinstance(pair, (list, tuple)) and len(pair) == 2:
                index, end = pair
                if isinstance(index, int) and isinstance(end, int) and 0 <= index < len(starts):
                    positions.append(starts[index] + end)
        return positions

    def request(
        self,
        text: PromptText,
        *,
        request_id: str,
        expected_output_tokens: int,
        session: str | None,
        tenant: str | None,
        arrival_s: float,
        public: bool = False,
    ) -> RouteRequest:
        """The route request of a routing text, its keys in the namespace of
        :func:`route_namespace`."""
        return self._keys.request(
            text,
            request_id=request_id,
            expected_output_tokens=expected_output_tokens,
            session=session,
            arrival_s=arrival_s,
            salt=route_namespace(tenant, public=public),
        )

    def observe_tokens(self, characters: int, prompt_tokens: int) -> None:
        """Refine the characters-per-token estimate from an engine's token count."""
        self._keys.observe_tokens(characters, prompt_tokens)
