"""The benchmark scripts of ``benchmarks/`` run from the checkout, write generated
sections, and use only the package's public names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bench
from lib.sections import begin_marker, end_marker

ROOT = Path(__file__).resolve().parent.parent


def test_quick_bench_writes_its_generated_section(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n\nprose kept\n", encoding="utf-8")
    argv = ["--quick", "--no-reference", "--runs", "2", "--latency-requests", "400"]
    assert bench.main([*argv, "--batch-sizes", "300", "--write", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nprose kept\n")
    assert begin_marker("bench") in text and text.rstrip().endswith(end_marker("bench"))
    assert "- runs: 2;" in text
    assert "hit ratio" in text.lower() and "latency" in text.lower()
    assert "### Batch mode" in text and "#### 75 requests" in text
    assert "2 runs)" in text  # timings show their spread over the runs


def _python_files() -> list[Path]:
    return sorted(
        [*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "contextpilot_rag").rglob("*.py")]
    )


def test_no_python_code_is_kept_in_a_string_and_run_with_dash_c() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in _python_files()
        if re.search(r"""sys\.executable,\s*["']-c["']""", path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_benchmarks_import_only_public_names_of_the_package() -> None:
    private = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if not node.module.startswith("contextpilot_rag"):
                continue
            names = [node.module, *(alias.name for alias in node.names)]
            if any(part.startswith("_") for name in names for part in name.split(".")):
                private.append(f"{path.relative_to(ROOT)}: from {node.module} import ...")
    assert private == []
