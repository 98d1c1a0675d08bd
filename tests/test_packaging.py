"""What the wheels and sdists declare, read from the ``pyproject.toml`` of the core and
of every integration package: the files the packages load at run time are package data,
each integration's bound on the core admits exactly the core's own minor series, and
the metadata a registry shows (license text, classifiers, versions) is complete and
consistent. Building the distributions is ``make dist``'s (``make test-wheels`` installs
and runs them); these read the declarations, in milliseconds."""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CORE = "contextpilot-rag"
PROJECTS = {
    CORE: ROOT,
    "langchain-contextpilot": ROOT / "integrations" / "langchain",
    "litellm-contextpilot": ROOT / "integrations" / "litellm",
    "llama-index-llms-contextpilot": ROOT / "integrations" / "llama-index-llms",
    "llama-index-postprocessor-contextpilot": ROOT / "integrations" / "llama-index",
    "contextpilot-mem0": ROOT / "integrations" / "mem0",
}
INTEGRATIONS = sorted(set(PROJECTS) - {CORE})
LITELLM_BOUNDS = SpecifierSet(">=1.83.7,<2")


def _pyproject(name: str) -> dict[str, Any]:
    return tomllib.loads((PROJECTS[name] / "pyproject.toml").read_text(encoding="utf-8"))


def _requirements(name: str) -> list[tuple[str | None, Requirement]]:
    """Each requirement of ``name`` with its extra (``None``: always installed)."""
    project = _pyproject(name)["project"]
    found: list[tuple[str | None, Requirement]] = [
        (None, Requirement(line)) for line in project.get("dependencies", [])
    ]
    for extra, lines in project.get("optional-dependencies", {}).items():
        found += [(extra, Requirement(line)) for line in lines]
    return found


def _package_data(name: str) -> dict[Path, list[str]]:
    """The directory of each package with declared package data, and its patterns."""
    declared = _pyproject(name)["tool"]["setuptools"]["package-data"]
    return {
        PROJECTS[name].joinpath(*package.split(".")): patterns
        for package, patterns in declared.items()
    }


def _data_files(package_dir: Path) -> list[str]:
    """Every file under ``package_dir`` that is not Python source or a cache."""
    return sorted(
        path.relative_to(package_dir).as_posix()
        for path in package_dir.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    )


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_every_file_a_package_holds_besides_source_ships_in_its_wheel(name: str) -> None:
    for package_dir, patterns in _package_data(name).items():
        files = _data_files(package_dir)
        undeclared = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
        assert not undeclared, f"{package_dir}: add to package-data or remove: {undeclared}"
        stale = [p for p in patterns if not any(fnmatch.fnmatch(f, p) for f in files)]
        assert not stale, f"{package_dir}: package-data patterns matching nothing: {stale}"


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_every_package_is_typed(name: str) -> None:
    assert all("py.typed" in patterns for patterns in _package_data(name).values())
    assert "Typing :: Typed" in _pyproject(name)["project"]["classifiers"]


def test_the_bundled_data_the_core_loads_is_declared() -> None:
    from contextpilot_rag.bench.corpus import BUNDLE_NAME

    (patterns,) = _package_data(CORE).values()
    assert any(fnmatch.fnmatch(f"data/{BUNDLE_NAME}", p) for p in patterns)


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_each_integration_requires_the_cores_own_minor_series(name: str) -> None:
    core = Version(_pyproject(CORE)["project"]["version"])
    (requirement,) = [r for extra, r in _requirements(name) if r.name == CORE and extra is None]
    assert core in requirement.specifier
    assert Version(f"{core.major}.{core.minor}.0") in requirement.specifier
    next_minor = Version(f"{core.major}.{core.minor + 1}.0")
    assert next_minor not in requirement.specifier, "0.x: a minor release may break"


def _declared_version(module_file: Path) -> str | None:
    """``__version__`` as the module assigns it, read without importing its framework."""
    for node in ast.parse(module_file.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    return None


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_a_packages_version_attribute_is_its_distribution_version(name: str) -> None:
    version = _pyproject(name)["project"]["version"]
    for package_dir in _package_data(name):
        declared = _declared_version(package_dir / "__init__.py")
        assert declared in (None, version), f"{package_dir}: __version__ {declared}"


def test_litellm_is_required_only_by_the_plugins_extras_with_the_safe_bounds() -> None:
    found = [
        (name, extra, requirement)
        for name in PROJECTS
        for extra, requirement in _requirements(name)
        if requirement.name == "litellm"
    ]
    assert {(name, extra) for name, extra, _ in found} == {
        ("litellm-contextpilot", "litellm"),
        ("litellm-contextpilot", "proxy"),
    }
    assert all(requirement.specifier == LITELLM_BOUNDS for _, _, requirement in found)


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_every_distribution_carries_the_license_text(name: str) -> None:
    project = _pyproject(name)["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (PROJECTS[name] / "LICENSE").read_text(encoding="utf-8")
    assert text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_the_python_classifiers_start_at_requires_python(name: str) -> None:
    project = _pyproject(name)["project"]
    prefix = "Programming Language :: Python :: 3."
    minors = sorted(int(c[len(prefix) :]) for c in project["classifiers"] if c.startswith(prefix))
    assert minors == list(range(minors[0], minors[-1] + 1)), "a gap in the Python versions"
    assert project["requires-python"] == f">=3.{minors[0]}"


def test_the_litellm_plugin_without_litellm_names_the_extra_to_install() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["litellm"] = None  # as if not installed
        sys.path.insert(0, {str(ROOT / "integrations" / "litellm")!r})
        try:
            import litellm_contextpilot
        except ModuleNotFoundError as error:
            print(error.name, error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split(" ", 1) == [
        "litellm",
        "litellm-contextpilot needs LiteLLM: pip install 'litellm-contextpilot[litellm]'\n",
    ]
