"""The public API is exactly what ``__all__`` lists (STYLE.md, practice 12): a name
added to or removed from a package's ``__all__`` is a decision made here, in review."""

from __future__ import annotations

import importlib

import pytest

PUBLIC_API: dict[str, list[str]] = {
    "contextpilot_rag": [
        "BlockBoundary",
        "BlockConflictError",
        "BlockId",
        "CharEstimateTokenizer",
        "ConfigError",
        "ContextBlock",
        "ContextIndex",
        "ContextPilot",
        "ContextPilotError",
        "Conversation",
        "ConversationExpiredError",
        "ConversationStateError",
        "ConversationStore",
        "DuplicateRequestError",
        "EmptyContextError",
        "HFTokenizer",
        "InMemoryConversationStore",
        "IndexConfig",
        "IndexStats",
        "InvalidBlockError",
        "InvalidInputError",
        "MatchResult",
        "NoteTemplates",
        "OversizeBlockError",
        "PilotConfig",
        "Prompt",
        "PromptStats",
        "RequestId",
        "TiktokenTokenizer",
        "Tokenizer",
        "Turn",
        "UnknownConversationError",
        "__version__",
        "content_id",
        "default_tokenizer",
        "render_block",
    ],
    "contextpilot_rag.routing": [
        "AccuracyModel",
        "AsyncChatStream",
        "Attempt",
        "ChatResult",
        "ChatStream",
        "ClientConfig",
        "CombinedConfig",
        "CombinedPolicy",
        "CostPolicy",
        "CostWeights",
        "Decision",
        "Endpoint",
        "EndpointError",
        "FleetView",
        "LaarPolicy",
        "LeastLoadPolicy",
        "LeastRequestPolicy",
        "Outcome",
        "POLICY_NAMES",
        "Policy",
        "PrefixCachePolicy",
        "RandomPolicy",
        "RanvierConfig",
        "RanvierPolicy",
        "ReplicaState",
        "RoundRobinPolicy",
        "RouteMemory",
        "RouteRequest",
        "RouteTable",
        "RoutingClient",
        "RoutingError",
        "RoutingMetrics",
        "SessionAffinityPolicy",
        "SolveResult",
        "TunerBounds",
        "WeightTuner",
        "make_policy",
    ],
    "contextpilot_rag.cloud": [
        "ANTHROPIC_RULES",
        "Breakpoint",
        "CachePlan",
        "CloudCacheConfig",
        "DEFAULT_PRICES",
        "InputCost",
        "ModelPrice",
        "OPENAI_BREAKPOINT_MODELS",
        "OPENAI_BREAKPOINT_RULES",
        "OPENAI_RULES",
        "PriceTable",
        "ProviderRules",
        "ReuseCandidate",
        "SkippedBreakpoint",
        "cache_prefix_bytes",
        "input_cost",
        "plan_breakpoints",
        "rules_for",
    ],
    "contextpilot_rag.sim": [
        "AnthropicCacheModel",
        "CacheBlock",
        "CacheResult",
        "ManualClock",
        "OpenAIBreakpointCacheModel",
        "OpenAIBreakpointUsage",
        "OpenAICacheModel",
        "OpenAICacheRules",
        "OpenAIUsage",
        "PrefixCacheModel",
        "Replica",
        "SimResult",
        "SimSummary",
        "default_fleet",
        "distinct_block_tokens",
        "load_mooncake",
        "load_scbench_kv",
        "simulate",
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC_API))
def test_all_lists_exactly_the_public_names(package: str) -> None:
    names = importlib.import_module(package).__all__
    assert len(names) == len(set(names)), "a name is listed twice"
    assert sorted(names) == PUBLIC_API[package]


PUBLIC_NAMES = [(package, name) for package, names in PUBLIC_API.items() for name in names]


@pytest.mark.parametrize(("package", "name"), PUBLIC_NAMES)
def test_every_public_name_is_importable(package: str, name: str) -> None:
    module = importlib.import_module(package)
    assert getattr(module, name) is not None
    exec(f"from {package} import {name}", {})  # the spelling users write
