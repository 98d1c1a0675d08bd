"""Run every ``examples/*.py`` with this interpreter, as a user who installed the wheels.

``make test-wheels`` runs it with a fresh venv holding only the wheels of ``dist/``:
it first checks that each of our packages is installed from a wheel file (not editable,
not the checkout) and imported from that venv's site-packages, then runs each example
as ``python examples/NAME.py`` in a scratch directory. The examples are offline: their
engines are the loopback OpenAI-compatible test server (``contextpilot_rag.testing``),
mem0 uses FAISS in a temporary directory and no LLM. Exit status 1 when a check or an
example fails.

Run: ``.venv-wheels/bin/python scripts/run_examples.py [--skip-install-check]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 300

# distribution name → the module it installs
PACKAGES = {
    "contextpilot-rag": "contextpilot_rag",
    "langchain-contextpilot": "langchain_contextpilot",
    "llama-index-postprocessor-contextpilot": "llama_index.postprocessor.contextpilot",
    "llama-index-llms-contextpilot": "llama_index.llms.contextpilot",
    "contextpilot-mem0": "contextpilot_mem0",
    "litellm-contextpilot": "litellm_contextpilot",
}


def install_problem(name: str, module_name: str) -> str | None:
    """Why ``name`` is not a wheel installed into this interpreter's site-packages
    (``None``: it is)."""
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return "not installed"
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        return "installed editable"
    if not str(direct_url.get("url", "")).endswith(".whl"):
        return f"not installed from a wheel file ({direct_url.get('url', 'from an index')})"
    spec = importlib.util.find_spec(module_name)  # not imported: extras may be missing
    module_file = Path(spec.origin if spec and spec.origin else "").resolve()
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    if not module_file.is_relative_to(site_packages):
        return f"{module_name} imported from {module_file}, not from {site_packages}"
    return None


def check_installs() -> list[str]:
    problems = []
    for name, module_name in PACKAGES.items():
        problem = install_problem(name, module_name)
        print(f"{name}: {problem or 'wheel in site-packages'}", flush=True)
        if problem:
            problems.append(f"{name}: {problem}")
    return problems


def run_example(path: Path, scratch: Path) -> str | None:
    """Run one example in ``scratch``; why it failed (``None``: it ran)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {"MEM0_TELEMETRY": "False", "MEM0_DIR": str(scratch / "mem0")}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(path)],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"still running after {TIMEOUT_S} s"
    print(f"{path.name}: exit {done.returncode} in {time.monotonic() - started:.1f} s", flush=True)
    if done.returncode != 0:
        return f"exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--skip-install-check",
        action="store_true",
        help="run the examples in any environment (a checkout's editable .venv too)",
    )
    args = parser.parse_args()
    problems = [] if args.skip_install_check else check_installs()
    if not problems:
        with tempfile.TemporaryDirectory(prefix="contextpilot-examples-") as scratch:
            for path in sorted(EXAMPLES.glob("*.py")):
                failure = run_example(path, Path(scratch))
                if failure:
                    problems.append(f"{path.name}: {failure}")
    for problem in problems:
        print(f"FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
