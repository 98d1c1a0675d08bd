"""What framework wrappers that hold a :class:`RoutingClient` share (the LangChain chat
model, the LlamaIndex LLM): who closes the client, and how the wrapper is told its
fleet."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import ConfigError
from .routing_client import RoutingClient

__all__ = ["OwnedClient", "client_source"]


class OwnedClient:
    """``close`` / ``aclose`` for a framework wrapper holding a :class:`RoutingClient`
    in ``client``: closed only if the wrapper created it (``_owns_client``)."""

    client: RoutingClient | None
    _owns_client: bool

    def close(self) -> None:
        """Close the client if this wrapper created it; a client passed in stays open."""
        if self._owns_client and self.client is not None:
            self.client.close()

    async def aclose(self) -> None:
        """Async :meth:`close` (also closes the connections of the async paths)."""
        if self._owns_client and self.client is not None:
            await self.client.aclose()


def client_source(owner: str, options: Mapping[str, object]) -> RoutingClient | None:
    """Check how a framework wrapper (``owner``) is told its fleet, from its
    constructor ``options``: exactly one of ``client`` (a :class:`RoutingClient`,
    returned) and ``endpoints`` (``None`` is returned: build the client from them, with
    ``model`` and ``policy``; a given client has its own). Raises
    :class:`ConfigError` before anything is created."""
    client, endpoints = options.get("client"), options.get("endpoints")
    model, policy = options.get("model"), options.get("policy")
    if (client is None) == (endpoints is None):
        raise ConfigError(
            f"{owner} needs exactly one of client= (a RoutingClient) or "
            "endpoints= (base URLs it builds its own client for)"
        )
    if client is not None:
        if not isinstance(client, RoutingClient):
            raise ConfigError(f"client must be a RoutingClient, got {type(client).__name__}")
        if model is not None or policy is not None:
            raise ConfigError("model= and policy= go with endpoints=; a given client has its own")
        return client
    if isinstance(endpoints, str):
        raise ConfigError("endpoints must be a list of base URLs, not one string")
    return None
