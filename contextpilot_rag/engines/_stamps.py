"""Install stamps: a small JSON file written last by a successful engine install, so a
half-finished install is never taken for a complete one."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["InstallStamp", "read_stamp", "write_stamp"]


@dataclass(frozen=True)
class InstallStamp:
    kind: str
    version: str
    size_bytes: int
    installed_at: str
    adopted: bool = False  # found complete (e.g. installed by hand) rather than built here


def read_stamp(path: Path) -> InstallStamp | None:
    """The stamp at ``path``, or ``None`` if it is missing or unreadable."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        data = json.loads(path.read_text())
        return InstallStamp(
            kind=str(data["kind"]),
            version=str(data["version"]),
            size_bytes=int(data["size_bytes"]),
            installed_at=str(data["installed_at"]),
            adopted=bool(data.get("adopted", False)),
        )
    return None


def write_stamp(
    path: Path, *, kind: str, version: str, size_bytes: int, adopted: bool = False
) -> InstallStamp:
    stamp = InstallStamp(kind, version, size_bytes, time.strftime("%Y-%m-%dT%H:%M:%S%z"), adopted)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(asdict(stamp), indent=2) + "\n")
    os.replace(partial, path)
    return stamp
