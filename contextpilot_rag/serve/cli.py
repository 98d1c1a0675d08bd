"""``contextpilot-rag serve``: the arguments and the command. Importing this module
imports neither starlette nor uvicorn (the main CLI imports it for its help)."""

from __future__ import annotations

import argparse
import os
import secrets
from typing import Any

from rich.console import Console

from ..errors import ConfigError
from ..routing.registry import POLICY_NAMES
from .config import API_KEY_ENV, SALT_KEY_ENV, ServeConfig

__all__ = ["add_serve_parser", "config_from_args", "run_serve"]


def add_serve_parser(commands: Any) -> None:
    """Add ``serve`` to a subparsers object."""
    parser = commands.add_parser(
        "serve",
        help="an OpenAI-compatible proxy in front of a fleet (documents in the "
        "'contextpilot' request field; see docs/serve.md)",
        description="Serve /v1/chat/completions, /v1/completions, /v1/models, /metrics and "
        "/health, routing over the fleet; requests carrying the 'contextpilot' field are "
        "reordered, de-duplicated and annotated first (docs/serve.md).",
        epilog="exit codes: 0 stopped (Ctrl-C or SIGTERM); 1 the server failed (e.g. its port "
        "is taken); 2 bad arguments or configuration (a store that cannot be opened, a "
        "missing serve extra)",
    )
    add = parser.add_argument
    add(
        "--endpoint",
        action="append",
        required=True,
        metavar="URL",
        help="an engine's OpenAI base URL, e.g. http://10.0.0.1:8000/v1 (repeat for a fleet)",
    )
    add("--model", required=True, help="the model the fleet serves")
    add(
        "--policy",
        choices=POLICY_NAMES,
        default="combined",
        metavar="NAME",
        help=f"routing policy: {', '.join(POLICY_NAMES)} (default combined)",
    )
    add("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, default=8040, help="port (default 8040)")
    add("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    add(
        "--api-key",
        help=f"bearer token clients must send (default: ${API_KEY_ENV}; none: no auth). "
        "Prefer the environment variable: arguments are visible in ps",
    )
    add("--store", metavar="URL", help="shared state: redis://HOST:PORT/DB or sqlite:///PATH")
    add(
        "--no-shared-index",
        dest="share_index",
        action="store_false",
        help="with --store: the workers share conversations and routes but each keeps its "
        "own context index (no index log; docs/stores.md)",
    )
    add(
        "--timeout-s",
        type=float,
        default=120.0,
        help="per-attempt progress bound towards an engine (default 120)",
    )
    add(
        "--max-history-turns",
        type=int,
        metavar="N",
        help="earlier turns of a conversation rendered into each prompt and kept in its "
        "stored record (default: all, so a record grows with its conversation; set it for "
        "a long-running server)",
    )
    add(
        "--system-into-user",
        action="store_true",
        help="send no system message: the system prompt opens the conversation's first user "
        "message, for chat templates that refuse a system message (Gemma 2's under vLLM) or "
        "move it before the last user message (Mistral Nemo's)",
    )
    add(
        "--cache-salt",
        choices=("private", "always", "never"),
        default="private",
        help="when a tenant's prompt carries its tenant's cache_salt (vLLM): private "
        "(default: unless all its documents are shared), always, or never (engines "
        f"without cache_salt). The salts derive from ${SALT_KEY_ENV} (a random key per "
        "run when unset: set it for several proxies on one fleet); see docs/tenants.md",
    )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """The :class:`ServeConfig` of parsed ``serve`` arguments (the API key from
    :data:`~.config.API_KEY_ENV` unless given)."""
    return ServeConfig(
        endpoints=tuple(args.endpoint),
        model=args.model,
        policy=args.policy,
        host=args.host,
        port=args.port,
        workers=args.workers,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        store=args.store,
        timeout_s=args.timeout_s,
        cache_salt=args.cache_salt,
        share_index=args.share_index,
        max_history_turns=args.max_history_turns,
        system_into_user=args.system_into_user,
        # one key for all workers of this run; several proxies need the variable
        salt_key=os.environ.get(SALT_KEY_ENV) or secrets.token_hex(32),
    )


def template_advice(config: ServeConfig) -> str | None:
    """What to change so that the fleet's chat template keeps conversations' history
    cacheable (:func:`~contextpilot_rag.engines.template_check.check_chat_template` on
    the first endpoint), or ``None``: nothing, or the engine cannot tell."""
    from ..engines.template_check import check_chat_template

    check = check_chat_template(config.endpoints[0], config.model, timeout_s=5.0)
    if check is None or (config.system_into_user and check.folded):
        return None
    return check.advice


def run_serve(args: argparse.Namespace, console: Console) -> int:
    """Run ``serve``; 2 for a configuration error. Warns first when the engine's chat
    template would keep conversations' history out of its prefix cache."""
    from .server import serve

    try:
        config = config_from_args(args)
        advice = template_advice(config)
        if advice is not None:
            console.print(f"warning: {advice}", style="yellow", markup=False, highlight=False)
        serve(config)
    except ConfigError as exc:
        console.print(str(exc), style="red", markup=False, highlight=False)
        return 2
    except SystemExit as exit_:  # uvicorn's start-up failure (a port in use) exits 3
        return 0 if exit_.code in (None, 0) else 1
    return 0
