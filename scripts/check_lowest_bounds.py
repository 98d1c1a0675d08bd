"""Check that ``make test-lowest`` installed each framework at its declared lower bound.

uv's ``--resolution lowest-direct`` takes each package's direct dependencies as low as
they install *together*: another package's requirement (or the order uv resolves in)
lifts a framework above the bound an adapter declares, silently, and that bound goes
untested. This reads the frameworks' lower bounds (``>=``) from the given
``pyproject.toml`` files (``dependencies`` and every extra) and the versions a venv
holds from ``uv pip freeze`` on stdin, and names each framework installed above a bound
declared for it. Exit status 1 when one is, unless it is named with ``--lifted`` (a lift
the Makefile explains); those are only listed.

Run: ``VIRTUAL_ENV=VENV uv pip freeze | python scripts/check_lowest_bounds.py
[--lifted NAME ...] PYPROJECT ...``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency there
    import tomli as tomllib

FRAMEWORKS = frozenset({"langchain-core", "llama-index-core", "mem0ai", "litellm"})
"""The packages the adapters plug into, whose lower bounds the lowest run is for."""


@dataclass(frozen=True)
class LowerBound:
    """``pyproject`` declares ``framework >= version``."""

    framework: str
    version: Version
    pyproject: Path


def lower_bounds(pyproject: Path) -> Iterator[LowerBound]:
    """The frameworks' ``>=`` bounds ``pyproject`` declares, in its dependencies and extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    for line in [*project.get("dependencies", []), *(r for rs in extras.values() for r in rs)]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name not in FRAMEWORKS:
            continue
        for spec in requirement.specifier:
            if spec.operator == ">=":
                yield LowerBound(name, Version(spec.version), pyproject)


def installed_versions(freeze: Iterable[str]) -> dict[str, Version]:
    """Name → version of the ``name==version`` lines of ``uv pip freeze`` (editables skipped)."""
    versions: dict[str, Version] = {}
    for line in freeze:
        name, sep, version = line.strip().partition("==")
        if sep:
            versions[canonicalize_name(name)] = Version(version)
    return versions


def untested(bound: LowerBound, installed: dict[str, Version]) -> str | None:
    """Why ``bound`` went untested (the venv holds another version, or none); ``None``
    when the venv holds its framework at exactly that version."""
    version = installed.get(bound.framework)
    if version == bound.version:
        return None
    held = "not installed" if version is None else f"installed {version}"
    return f"{bound.framework}>={bound.version} ({bound.pyproject}) is untested: {held}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyprojects", nargs="+", type=Path)
    parser.add_argument("--lifted", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    known = {canonicalize_name(name) for name in args.lifted}
    installed = installed_versions(sys.stdin)
    bounds = dict.fromkeys(bound for path in args.pyprojects for bound in lower_bounds(path))
    failed = False
    for bound in bounds:  # each once, though several extras repeat it
        reason = untested(bound, installed)
        if reason is not None:
            failed |= bound.framework not in known
            kind = "known lift" if bound.framework in known else "ERROR"
            print(f"test-lowest: {kind}: {reason}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
