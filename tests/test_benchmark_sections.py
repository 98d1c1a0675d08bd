"""Benchmarks write their own generated sections of a document and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.sections import begin_marker, end_marker, spread, write_section


def test_a_section_is_replaced_in_place_and_the_rest_is_kept(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nhand-written prose\n", encoding="utf-8")
    write_section(doc, "routing", "## Routing\n\nv1")
    write_section(doc, "engine", "## Engine\n\nv1")
    doc.write_text(doc.read_text(encoding="utf-8") + "\nprose after the sections\n")
    write_section(doc, "routing", "## Routing\n\nv2")
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nhand-written prose\n\n" + begin_marker("routing"))
    assert text.endswith("prose after the sections\n")
    assert "v1" not in text.split(end_marker("routing"))[0]  # replaced, not appended
    assert text.index("## Routing") < text.index("## Engine")  # kept its place
    assert text.count("## Routing") == 1 and "## Engine\n\nv1" in text


def test_a_new_file_holds_only_the_section(tmp_path: Path) -> None:
    doc = tmp_path / "new" / "doc.md"
    write_section(doc, "x", "body")
    assert doc.read_text(encoding="utf-8") == f"{begin_marker('x')}\n\nbody\n\n{end_marker('x')}\n"


def test_a_section_name_cannot_break_the_markers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="section names"):
        write_section(tmp_path / "doc.md", "two words", "body")


def test_spread_shows_the_range_only_for_several_runs() -> None:
    assert spread([1.0], ".1f", " ms") == "1.0 ms"
    assert spread([3.0, 1.0, 2.0], ".1f", " ms") == "2.0 ms (1.0–3.0 ms, 3 runs)"
