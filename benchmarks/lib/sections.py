"""Generated sections of ``docs/`` (``<!-- BEGIN GENERATED: name -->`` …): the
convention lives in the package, :mod:`contextpilot_rag.bench.sections`, since
``contextpilot-rag eval --write`` writes such sections too; the scripts import it from
here as before."""

from contextpilot_rag.bench.sections import (
    begin_marker,
    end_marker,
    machine,
    markdown_table,
    provenance,
    pyplot,
    save_figure,
    spread,
    write_or_print,
    write_section,
)

__all__ = [
    "begin_marker",
    "end_marker",
    "machine",
    "markdown_table",
    "provenance",
    "pyplot",
    "save_figure",
    "spread",
    "write_or_print",
    "write_section",
]
