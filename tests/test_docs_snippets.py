"""The docs' code is code a user can run (STYLE.md, Docs), checked on README.md,
docs/*.md and docs/integrations/*.md:

1. every Python block parses (top-level ``await`` allowed: the async examples);
2. every name a block imports from this project's packages, and every dotted name
   (``contextpilot_rag.cloud.input_cost``) the pages mention, exists;
3. every link between the pages leads to a file and, with a ``#fragment``, to one of its
   headings;
4. the Python blocks of the core pages run, in page order in one namespace as a reader
   would type them, against the loopback OpenAI-compatible engine and the cloud
   emulator; the few that need what a test cannot have (a proxy on a fixed port, a
   model's tokenizer file) are listed in ``NOT_RUN`` with the test that covers them.
   The names a page leaves to the reader (``retriever``, ``client``, ``MODEL``, …) are
   given in ``reader_names``.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.testing import SAMPLE_CORPUS, CloudCacheServer, OpenAICompatibleServer

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # read by litellm at import

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs/integrations").glob("*.md")]
)
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
GENERATED = re.compile(r"<!-- BEGIN GENERATED.*?<!-- END GENERATED[^>]*-->", re.S)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*$", re.M)
# this project's importable packages (the adapters' only where installed)
PACKAGES = (
    "contextpilot_rag",
    "langchain_contextpilot",
    "llama_index.postprocessor.contextpilot",
    "llama_index.llms.contextpilot",
    "contextpilot_mem0",
    "litellm_contextpilot",
)
DOTTED = re.compile(
    r"\b(?:" + "|".join(re.escape(package) for package in PACKAGES) + r")(?:\.\w+)*"
)
NOT_MODULES = {"contextpilot_rag.routing.decisions"}  # a logger's name (routing.metrics)

# the pages whose Python blocks run here; the integration pages' run in
# tests/integrations (the frameworks' own tests) and examples/
RUN_PAGES = ("README.md", "quickstart.md", "api.md", "tenants.md", "cloud_emulator.md")
# block (its page and a line of it) -> why it does not run here, and what covers it
NOT_RUN = {
    ("README.md", 'OpenAI(base_url="http://127.0.0.1:8040/v1"'): (
        "a proxy on a fixed port: examples/serve_client.py sends the same request"
    ),
    ("quickstart.md", 'HF.from_file("tokenizer.json")'): (
        "a model's tokenizer file: tests/test_tokenizers.py builds HFTokenizer"
    ),
    ("cloud_emulator.md", "with CloudCacheServer(clock=clock) as server:"): (
        "a placeholder body (...): tests/test_cloud_server.py"
    ),
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    text = page.read_text("utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        indent = len(match["indent"])
        code = "\n".join(line[indent:] for line in match["body"].splitlines())
        line = text.count("\n", 0, match.start()) + 2
        blocks.append(Block(page.name, line, match["lang"], code + "\n"))
    return blocks


def python_blocks(pages: list[Path]) -> list[Block]:
    return [block for page in pages for block in code_blocks(page) if block.lang == "python"]


def compiled(block: Block) -> Any:
    return compile(block.code, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def ours(module: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in PACKAGES)


def import_or_skip(module: str) -> Any:
    """Our module, or a skip when it is an adapter (or needs an extra) not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if module.startswith("contextpilot_rag") and error.name and ours(error.name):
            raise
        pytest.skip(f"{module}: {error}")


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then
    attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        candidate = ".".join(parts[:cut])
        try:
            found: object = importlib.import_module(candidate)
        except ModuleNotFoundError as error:
            if not (error.name and ours(error.name)):
                raise  # the module is there, a package it needs is not
            continue  # no such module of ours: a shorter prefix, then attributes
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text("utf-8"), flags=re.S | re.M)
    found: set[str] = set()
    for match in HEADING.finditer(text):
        base, number = slug(match["title"]), 0
        while (anchor := base if number == 0 else f"{base}-{number}") in found:
            number += 1
        found.add(anchor)
    return found


# -- 1. every Python block parses ---------------------------------------------------------


@pytest.mark.parametrize("block", python_blocks(DOCS), ids=str)
def test_every_python_block_parses(block: Block) -> None:
    compiled(block)


# -- 2. every name the docs use exists ----------------------------------------------------


@pytest.mark.parametrize("block", python_blocks(DOCS), ids=str)
def test_every_name_a_block_imports_from_us_exists(block: Block) -> None:
    tree = ast.parse(block.code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and ours(node.module):
            module = import_or_skip(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block}: {node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name):
                    import_or_skip(alias.name)


@pytest.mark.parametrize("page", DOCS, ids=lambda page: page.name)
def test_every_dotted_name_the_pages_mention_exists(page: Path) -> None:
    text = GENERATED.sub("", page.read_text("utf-8"))
    for dotted in sorted(set(DOTTED.findall(text)) - NOT_MODULES):
        root = next(package for package in PACKAGES if ours(dotted) and dotted.startswith(package))
        import_or_skip(root)
        try:
            resolve(dotted)
        except ImportError as error:
            if error.name and not ours(error.name):
                continue  # an extra not installed here
            pytest.fail(f"{page.name}: `{dotted}` does not exist ({error})")
        except AttributeError as error:
            pytest.fail(f"{page.name}: `{dotted}` does not exist ({error})")


# -- 3. every link between the pages resolves ---------------------------------------------


@pytest.mark.parametrize("page", DOCS, ids=lambda page: page.name)
def test_every_link_between_the_pages_resolves(page: Path) -> None:
    for match in LINK.finditer(page.read_text("utf-8")):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        assert destination.exists(), f"{page.name}: {target}: no such file"
        if fragment and destination.suffix == ".md":
            assert fragment in anchors(destination), f"{page.name}: {target}: no such heading"


# -- 4. the core pages' blocks run --------------------------------------------------------


@dataclass
class _Retrieved:
    id: str
    text: str

    @property
    def doc_id(self) -> str:
        return self.id


@pytest.fixture(scope="module")
def engine() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer() as server:
        yield server


@pytest.fixture(scope="module")
def cloud() -> Iterator[CloudCacheServer]:
    with CloudCacheServer() as server:
        yield server


@pytest.fixture
def reader_names(
    engine: OpenAICompatibleServer, cloud: CloudCacheServer, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """What the pages leave to the reader: a retriever, an OpenAI client on the loopback
    engine, a question; the SDKs' own environment points them at the cloud emulator."""
    openai = pytest.importorskip("openai")
    monkeypatch.setenv("OPENAI_BASE_URL", cloud.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", cloud.anthropic_base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    client = openai.OpenAI(base_url=engine.base_url, api_key="test")
    documents = [_Retrieved(doc_id, text) for doc_id, text in list(SAMPLE_CORPUS.items())[:4]]
    blocks = [ContextBlock(doc.text, id=doc.id) for doc in documents]
    pilot = ContextPilot()
    query = "When was the Eiffel Tower built?"

    def call_llm(messages: list[dict[str, Any]]) -> str:
        answer = client.chat.completions.create(model=engine.model, messages=messages)
        return str(answer.choices[0].message.content)

    return {
        "retriever": lambda _query: documents,
        "query": query,
        "question": query,
        "client": client,
        "openai_client": client,
        "MODEL": engine.model,
        "call_llm": call_llm,
        "pilot": pilot,
        "blocks": blocks,
        "prompt": pilot.optimize(blocks, query),
        "batch": [(blocks, query), (blocks[::-1], "Where is the Louvre?")],
        "results": {},
        "SECRET": "a salt key of at least sixteen characters",
        "token_ids": list(range(2048)),
    }


def not_run(block: Block) -> str | None:
    for (page, line), reason in NOT_RUN.items():
        if block.page == page and line in block.code:
            return reason
    return None


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_core_pages_blocks_run_in_order(page: str, reader_names: dict[str, Any]) -> None:
    path = next(doc for doc in DOCS if doc.name == page)
    namespace = {"__name__": "__docs__", **reader_names}
    ran = 0
    for block in python_blocks([path]):
        if not_run(block) is None:
            exec(compiled(block), namespace)
            ran += 1
    assert ran, f"{page} has no block that runs here"


def test_every_block_not_run_still_exists() -> None:
    """An entry of NOT_RUN that matches no block would excuse nothing: keep it current."""
    blocks = python_blocks(DOCS)
    for (page, line), _reason in NOT_RUN.items():
        assert any(b.page == page and line in b.code for b in blocks), (page, line)


def our_public_names() -> set[str]:
    """The names users import from us: the ``__all__`` of every package of ours that is
    installed here."""
    names: set[str] = set()
    for module_name in (
        "contextpilot_rag",
        "contextpilot_rag.routing",
        "contextpilot_rag.cloud",
        "contextpilot_rag.stores",
        "contextpilot_rag.tenants",
        "contextpilot_rag.serve",
        "contextpilot_rag.testing",
        "contextpilot_rag.kv_events",
        "contextpilot_rag.engines",
        *PACKAGES[1:],
    ):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        names |= {name for name in getattr(module, "__all__", ()) if not name.startswith("_")}
    return names


def defined_names(tree: ast.AST) -> set[str]:
    """What a block binds: imports, assignments, definitions, loop and with targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


@pytest.mark.parametrize("page", DOCS, ids=lambda page: page.name)
def test_a_block_imports_the_names_of_ours_it_uses(page: Path) -> None:
    """A reader copies a block and its page's earlier blocks; a class of ours they use
    must be imported there (the reader's own objects, ``retriever`` or ``llm``, need not)."""
    public, defined = our_public_names(), set[str]()
    for block in python_blocks([page]):
        tree = ast.parse(block.code)
        defined |= defined_names(tree)
        used = {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        missing = sorted((used & public) - defined)
        assert not missing, f"{block}: uses {missing} without importing them"
