"""``python -m contextpilot_rag.engines install|start|stop|status``: the same commands
as ``contextpilot-rag engine ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from .cli import add_engine_commands, run_engine_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m contextpilot_rag.engines",
        description="Install, start and stop inference engines (same as "
        "`contextpilot-rag engine ...`).",
    )
    add_engine_commands(parser.add_subparsers(dest="engine_command", required=True))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run_engine_command(args, Console())


if __name__ == "__main__":
    raise SystemExit(main())
