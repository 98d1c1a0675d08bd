"""Benchmarks write their own delimited sections of one document."""

from __future__ import annotations

from pathlib import Path

from contextpilot_rag.bench.document import write_section
from contextpilot_rag.cli import KEPT_SECTIONS_MARKER


def test_sections_are_replaced_in_place_and_the_rest_is_kept(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nmain results\n", encoding="utf-8")
    write_section(doc, "routing", "## Routing\n\nv1", KEPT_SECTIONS_MARKER)
    write_section(doc, "engine", "## Engine\n\nv1", KEPT_SECTIONS_MARKER)
    write_section(doc, "routing", "## Routing\n\nv2", KEPT_SECTIONS_MARKER)
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nmain results\n\n" + KEPT_SECTIONS_MARKER)
    assert text.count(KEPT_SECTIONS_MARKER) == 1
    assert "v1" not in text.split("<!-- end routing -->")[0]  # replaced, not appended
    assert text.index("## Routing") < text.index("## Engine")  # kept its place
    assert text.count("## Routing") == 1 and "## Engine\n\nv1" in text
