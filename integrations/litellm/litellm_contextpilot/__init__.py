"""litellm_contextpilot: contextpilot-rag inside LiteLLM.

- :class:`ContextPilotRoutingStrategy` routes a ``litellm.Router``'s calls with our
  policies (``combined``, ``ranvier``, ``gorgo``, ...): each deployment is a replica,
  prefix-cache locality and load are learned from LiteLLM's success and failure
  callbacks (``cached_tokens``, TTFT)::

      router = Router(model_list=[...])
      ContextPilotRoutingStrategy("combined").attach(router)

- :class:`ContextPilotHook` applies the pilot to requests that carry their documents
  in the ``contextpilot`` field (the field ``contextpilot-rag serve`` reads), as the
  proxy's pre-call hook or through :meth:`ContextPilotHook.apply`, and records each
  answer as the conversation's turn.

See ``integrations/litellm/README.md`` and ``docs/integrations/litellm.md``.
"""

import importlib.util

# LiteLLM comes only with the `litellm` extra (its pinned bounds): without it, say which
# install is missing rather than fail deep inside a submodule
if importlib.util.find_spec("litellm") is None:
    raise ModuleNotFoundError(
        "litellm-contextpilot needs LiteLLM: pip install 'litellm-contextpilot[litellm]'",
        name="litellm",
    )

from ._field import FIELD, PilotRequest, read_pilot_request
from ._fleet import FleetConfig
from ._hook import ContextPilotHook
from ._keys import PLAIN_TEMPLATE
from ._strategy import ContextPilotRoutingStrategy, proxy_router

__version__ = "0.1.0"

__all__ = [
    "FIELD",
    "PLAIN_TEMPLATE",
    "ContextPilotHook",
    "ContextPilotRoutingStrategy",
    "FleetConfig",
    "PilotRequest",
    "__version__",
    "proxy_router",
    "read_pilot_request",
]
