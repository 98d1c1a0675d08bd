"""Every measured figure in the docs comes from a script (STYLE.md, practice 14).

The rule, checked on README.md, docs/*.md and docs/integrations/*.md:

1. A **generated section** is the text between a line ``<!-- BEGIN GENERATED: name -->``
   and a line ``<!-- END GENERATED: name -->`` (same name, not nested, each marker on a
   line of its own). Benchmarks write them (``benchmarks/lib/sections.py``); each names
   the command that wrote it.
2. A **figure** is a number (digits, optional thousands commas and decimals, optional
   leading ``~ ≈ < > ≤ ≥ + − -``) followed, directly or after one space, by
   - ``%`` (a share or a change),
   - ``×`` or ``x`` written right after the number and not followed by a letter or a
     digit (a ratio such as ``2.1×``; fleet shapes such as ``3 × 1`` or ``3×2`` are not
     ratios),
   - a time unit: ``ns µs us ms s sec second(s) min minute(s) h hour(s)``,
   - a rate or size unit: ``/s``, ``tokens/s``, ``tok/s``, ``KB MB GB KiB MiB GiB``,
     or ``token(s)`` as a count (``23,766 tokens``; the hyphenated ``16-token blocks``
     describes a configuration and is not a figure).
3. Outside generated sections, figures may appear only in **code**: fenced code blocks
   and inline code spans, which is where configuration defaults, API constants and
   commands are written (``hold_wait_s=1.0``, ```backoff_s`` (``0.5``)``, ``--rates 0.4``).
   HTML comments are ignored. Version numbers, dates and plain counts ("16 replicas",
   "5 documents") are not figures by (2).

So prose explains and points at the generated section that holds the number; a
number no script produces has no place in the docs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs/integrations").glob("*.md")]
)

BEGIN = re.compile(r"^<!-- BEGIN GENERATED: ([\w.-]+) -->$", re.M)
END = re.compile(r"^<!-- END GENERATED: ([\w.-]+) -->$", re.M)
SECTION = re.compile(
    r"^<!-- BEGIN GENERATED: (?P<name>[\w.-]+) -->$(?P<body>.*?)"
    r"^<!-- END GENERATED: (?P=name) -->$",
    re.S | re.M,
)
FENCED = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
FIGURE = re.compile(
    r"""(?<![\w.,/-])                     # not inside a word, identifier or version
        [~≈<>≤≥+−-]?\d[\d,]*(?:\.\d+)?
        (?:
            [×x](?![\w\d])                # a ratio: 2.1x, 1.5×
          | \ ?%
          | \ ?(?:ns|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?)(?![\w/])
          | \ ?(?:tokens?|tok)/s(?!\w)
          | \ ?/s(?!\w)
          | \ ?[KMG]i?B(?!\w)
          | \ tokens?(?![\w-])
        )""",
    re.X,
)


def prose(text: str) -> str:
    """``text`` without generated sections, code and comments (line breaks kept, so
    line numbers still point at the source)."""

    def blank(match: re.Match[str]) -> str:
        return "\n" * match.group(0).count("\n")

    for pattern in (SECTION, FENCED, COMMENT, CODE_SPAN):
        text = pattern.sub(blank, text)
    return text


def figures(text: str) -> list[str]:
    """``line: figure`` for each figure outside generated sections and code."""
    found = []
    for number, line in enumerate(prose(text).splitlines(), start=1):
        found += [f"{number}: {match.group(0)}" for match in FIGURE.finditer(line)]
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_figures_appear_only_in_generated_sections_or_code(path: Path) -> None:
    assert figures(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_generated_sections_are_balanced_and_name_their_command(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    begins, ends = BEGIN.findall(text), END.findall(text)
    sections = list(SECTION.finditer(text))
    assert begins == ends == [section["name"] for section in sections]
    assert len(set(begins)) == len(begins), "a section name appears twice"
    for section in sections:
        assert not BEGIN.search(section["body"]), f"{section['name']}: nested section"
        assert "command" in section["body"].lower(), f"{section['name']}: no command"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hit ratio rose to 33.4% here", ["1: 33.4%"]),
        ("combined is 2.1× faster, 1.5x on the other", ["1: 2.1×", "1: 1.5x"]),
        ("a p95 of 4,644 ms and ~35 s, 77.9 µs", ["1: 4,644 ms", "1: ~35 s", "1: 77.9 µs"]),
        (
            "prefill at 196 tokens/s, 23,766 tokens, 8 GiB",
            ["1: 196 tokens/s", "1: 23,766 tokens", "1: 8 GiB"],
        ),
        ("a 3 × 1 fleet, 3×2 too, 16-token blocks, 16 replicas, v0.5.0, 2026-11-25", []),
        ("defaults: `hold_wait_s=1.0`, `--rates 0.4/s`", []),
        ("```\nmake bench   # ~7 min\n```", []),
        ("<!-- BEGIN GENERATED: x -->\n- command: `x`\n12.5%\n<!-- END GENERATED: x -->", []),
        ("`<!-- BEGIN GENERATED: x -->` 12.5%\n<!-- END GENERATED: x -->", ["1: 12.5%"]),
    ],
)
def test_the_rule_on_examples(text: str, expected: list[str]) -> None:
    assert figures(text) == expected
