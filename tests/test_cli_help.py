"""Every option of every ``contextpilot-rag`` subcommand says what it does in ``--help``,
and every subcommand's ``--help`` states its exit codes (docs/cli.md has them as tables)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from contextpilot_rag.cli import _parser, main


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand parser under it, each with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def _subcommand_helps(parser: argparse.ArgumentParser) -> Iterator[tuple[str, object]]:
    """The help line of each subcommand listed in ``parser``'s own ``--help``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield choice.dest, choice.help


PARSERS = list(_parsers(_parser()))
NAMES = [" ".join(path) or "contextpilot-rag" for path, _ in PARSERS]
COMMANDS = [(path, parser) for path, parser in PARSERS if len(path) == 1]


def _described(text: object) -> bool:
    return isinstance(text, str) and bool(text.strip()) and text != argparse.SUPPRESS


def test_the_tree_has_every_subcommand() -> None:
    commands = {" ".join(path) for path, _ in PARSERS if path}
    expected = {"demo", "bench", "engine", "serve", "eval", "optimize"}
    expected |= {f"engine {name}" for name in ("install", "start", "stop", "status")}
    assert commands == expected


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=NAMES)
def test_every_option_has_help(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    missing = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not _described(action.help)
    ]
    assert missing == [], f"contextpilot-rag {' '.join(path)}: options without help"


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=NAMES)
def test_every_subcommand_has_help(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    missing = [name for name, text in _subcommand_helps(parser) if not _described(text)]
    assert missing == [], f"contextpilot-rag {' '.join(path)}: subcommands without help"


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[p[0] for p, _ in COMMANDS])
def test_every_command_help_states_its_exit_codes(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    assert "exit" in (parser.epilog or ""), f"contextpilot-rag {path[0]} --help: no exit codes"


def test_a_usage_error_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["optimize", "--no-such-option"])
    assert stopped.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_python_dash_m_runs_the_command() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "contextpilot_rag", "optimize", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: contextpilot-rag optimize" in done.stdout
