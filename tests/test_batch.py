"""Specification of batch mode: planners, schedulers and ContextPilot.optimize_batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpilot_rag import (
    BlockConflictError,
    ConfigError,
    ContextBlock,
    ContextPilot,
    DuplicateRequestError,
    EmptyContextError,
    InvalidInputError,
    OversizeBlockError,
    PilotConfig,
    Tokenizer,
    render_block,
)
from contextpilot_rag.batch import (
    REFINE_UP_TO,
    BatchMethod,
    check_plan,
    greedy_plan,
    grouped_schedule,
    plan_batch,
    prefix_tree_schedule,
    refine_sequences,
    shared_tokens,
)
from contextpilot_rag.batch.plan import sequences_of
from contextpilot_rag.batch.requests import BatchRequest
from contextpilot_rag.batch.trie import PrefixTrie


def doc(name: str) -> ContextBlock:
    return ContextBlock(f"Document {name} says that fact {name} holds.", id=name)


DOCS = {name: doc(name) for name in "abcdefghijklmnop"}


def blocks(names: str) -> list[ContextBlock]:
    return [DOCS[name] for name in names]


# Distinct codes per request, from a small pool so that requests overlap.
requests_strategy = st.lists(
    st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=8, unique=True),
    min_size=0,
    max_size=40,
)


# -- planners and schedulers ------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(requests_strategy)
def test_greedy_plan_is_a_valid_plan(requests: list[list[int]]) -> None:
    check_plan(greedy_plan(requests), [len(request) for request in requests])


@settings(max_examples=50, deadline=None)
@given(requests_strategy)
def test_greedy_plan_is_deterministic(requests: list[list[int]]) -> None:
    assert greedy_plan(requests) == greedy_plan([list(request) for request in requests])


def test_requests_sharing_blocks_get_them_first_and_run_together() -> None:
    requests = [[1, 2, 3], [9, 8, 7], [3, 5, 1], [7, 6, 9], [2, 3, 1, 4]]
    plan = greedy_plan(requests)
    sequences = [[requests[i][p] for p in plan.orders[i]] for i in range(len(requests))]
    assert sequences[0][:3] == sequences[4][:3] == [1, 3, 2]  # {1,2,3}: held by 0 and 4
    assert sequences[2][:2] == [1, 3]  # {1,3}: also held by 2
    assert sequences[1][:2] == sequences[3][:2]  # {7,9} shared
    position = {request: slot for slot, request in enumerate(plan.schedule)}
    assert abs(position[0] - position[4]) == 1
    assert abs(position[1] - position[3]) == 1


def test_token_weights_prefer_sharing_the_longer_block() -> None:
    # Block 0 is held by three requests, block 1 by two others' worth: 0 wins on
    # counts, 1 wins once it is known to be 100 times longer.
    requests = [[0, 1], [0, 5], [0, 6], [1, 7]]
    by_count = greedy_plan(requests)
    by_tokens = greedy_plan(requests, weights=[1, 100, 1, 1, 1, 1, 1, 1])
    assert requests[0][by_count.orders[0][0]] == 0
    assert requests[0][by_tokens.orders[0][0]] == 1
    assert requests[3][by_tokens.orders[3][0]] == 1


def test_lookahead_prefers_the_split_that_shares_more_in_total() -> None:
    # Splitting on 0 first (three holders) still lets two of them share 1 next:
    # 2 + 100 tokens reused, against 100 + 1 when 1 goes first.
    requests = [[0, 1, 5], [0, 1, 6], [0, 7]]
    plan = greedy_plan(requests, weights=[1, 100, 1, 1, 1, 1, 1, 1])
    assert [requests[0][p] for p in plan.orders[0]][:2] == [0, 1]


def test_shared_tokens_counts_blocks_sent_after_a_prefix_already_sent() -> None:
    requests = [[1, 2, 3], [2, 1, 4], [5]]
    orders = [(0, 1, 2), (1, 0, 2), (0,)]  # 1 2 3 / 1 2 4 / 5
    assert shared_tokens(requests, orders) == 2
    assert shared_tokens(requests, orders, weights=[0, 10, 3, 0, 0, 0]) == 13
    assert shared_tokens(requests, [(0, 1, 2), (0, 1, 2), (0,)]) == 0  # 1 2 3 / 2 1 4


@settings(max_examples=60, deadline=None)
@given(requests_strategy, st.randoms(use_true_random=False))
def test_shared_tokens_do_not_depend_on_the_execution_order(
    requests: list[list[int]], rng: object
) -> None:
    plan = plan_batch(requests)
    order = list(range(len(requests)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    shuffled = shared_tokens([requests[i] for i in order], [plan.orders[i] for i in order])
    assert shuffled == shared_tokens(requests, plan.orders)


@settings(max_examples=60, deadline=None)
@given(requests_strategy)
def test_auto_plan_is_valid_and_shares_as_much_as_the_better_builder(
    requests: list[list[int]],
) -> None:
    auto = plan_batch(requests, refine=False)  # "auto" is the default
    check_plan(auto, [len(request) for request in requests])
    best = max(
        shared_tokens(requests, plan_batch(requests, method=method, refine=False).orders)
        for method in ("greedy", "cluster")
    )
    assert shared_tokens(requests, auto.orders) == best
    refined = plan_batch(requests)  # refined by default at this size
    check_plan(refined, [len(request) for request in requests])
    assert shared_tokens(requests, refined.orders) >= best


@settings(max_examples=40, deadline=None)
@given(requests_strategy, st.sampled_from(["auto", "greedy", "cluster"]))
def test_sparse_codes_plan_as_their_dense_renumbering(
    requests: list[list[int]], method: BatchMethod
) -> None:
    """Hashed ids as codes (10**10 and up): the planners size arrays by the largest
    code, so they plan on the codes renumbered in order, which gives the same plan
    (and no 75 GiB allocation)."""
    sparse = [[10**10 + 7_919 * code for code in request] for request in requests]
    assert plan_batch(sparse, method=method) == plan_batch(requests, method=method)


def test_auto_takes_the_clustering_on_near_duplicate_requests() -> None:
    from contextpilot_rag.bench.workloads import intent_workload

    workload = intent_workload(n_docs=600, n_requests=400, k=10, n_intents=60, swap=0.3)
    codes: dict[str, int] = {}
    requests = [[codes.setdefault(d, len(codes)) for d in r.doc_ids] for r in workload.requests]
    shared = {
        method: shared_tokens(requests, plan_batch(requests, method=method, refine=False).orders)
        for method in ("greedy", "cluster", "auto")
    }
    assert shared["cluster"] > shared["greedy"]  # why "auto" builds both
    assert shared["auto"] == shared["cluster"]


def test_refining_moves_a_request_to_the_prefix_it_shares_most() -> None:
    # greedy splits on block 1 (three holders) and leaves request 0 there, where it
    # shares one block; under request 1's prefix (2, 3) it shares two
    requests = [[1, 2, 3], [2, 3, 4], [1, 5], [1, 6]]
    greedy = plan_batch(requests, method="greedy", refine=False)
    assert shared_tokens(requests, greedy.orders) == 2
    refined = plan_batch(requests, method="greedy")
    check_plan(refined, [len(request) for request in requests])
    assert shared_tokens(requests, refined.orders) == 3
    sequence = [requests[0][p] for p in refined.orders[0]]
    assert sequence[:2] == [2, 3]


def test_refining_reorders_a_partners_tail_so_a_request_can_follow_it() -> None:
    # requests 0 and 2 share block 1 and both hold 3 and 4, each after a block the
    # other lacks (5, 9), so neither can follow the other's path; but past block 1
    # each continues alone, so one reorders its tail to put 3, 4 first and the
    # other follows it through them
    sequences = [[1, 5, 3, 4], [1, 6], [1, 9, 3, 4]]
    weights, rank = [1.0] * 10, list(range(10))
    identity = [list(range(4)), list(range(2)), list(range(4))]
    assert shared_tokens(sequences, identity) == 2
    refined = refine_sequences(sequences, weights, rank)
    assert refined[2] == [1, 3, 4, 9]
    assert refined[0] == [1, 3, 4, 5]
    assert refined[1] == [1, 6]
    assert shared_tokens(refined, identity) == 4


def test_joint_moves_free_two_requests_that_no_single_move_frees() -> None:
    # requests 0 and 1 share blocks 3, 4, 5, but each is held by a prefix the other
    # lacks (1, shared with request 2; 2, shared with request 3): no single move pays,
    # moving both together under 3, 4, 5 does
    sequences = [[1, 3, 4, 5], [2, 3, 4, 5], [1, 6], [2, 7]]
    weights, rank = [1.0] * 8, list(range(8))
    identity = [list(range(len(s))) for s in sequences]
    assert shared_tokens(sequences, identity) == 2
    assert refine_sequences(sequences, weights, rank, passes=3) == sequences
    joint = refine_sequences(sequences, weights, rank, pairs=1)
    assert joint[0][:3] == joint[1][:3] == [3, 4, 5]
    assert shared_tokens(joint, identity) == 3


@pytest.mark.parametrize("method", ["auto", "greedy", "cluster"])
@pytest.mark.parametrize(
    ("requests", "weights"),
    [
        ([[0, 0, 1], [1, 0]], None),  # a repeated code
        ([[-1, 0], [0, 1]], None),  # a negative code (the builders' padding value)
        ([[-2, 0], [0]], None),
        ([[0, 1], [1, 2]], [1.0, 1.0]),  # no weight for code 2
        ([[0, 1]], [1.0, float("nan")]),
    ],
)
def test_every_method_refuses_codes_its_orders_could_not_permute(
    method: BatchMethod, requests: list[list[int]], weights: list[float] | None
) -> None:
    """Greedy returned orders that dropped a position (a repeat, a code equal to its
    padding) or raised bare numpy and index errors."""
    with pytest.raises(InvalidInputError):
        plan_batch(requests, method=method, weights=weights)
    if method == "greedy":
        with pytest.raises(InvalidInputError):
            greedy_plan(requests, weights=weights)


def test_plan_batch_makes_the_joint_moves_single_moves_cannot() -> None:
    # the greedy build puts request 0 under block 1 (with 2 and 3) and request 1 under
    # block 2 (with 4 and 5), though 0 and 1 share 3, 4, 5; no single move frees either
    # (each would lose its prefix), moving both under 3, 4, 5 shares one block more
    requests = [[1, 3, 4, 5], [2, 3, 4, 5], [1, 6, 8], [1, 6, 9], [2, 7, 10], [2, 7, 11]]
    greedy = greedy_plan(requests)
    assert shared_tokens(requests, greedy.orders) == 6
    rank = list(range(12))
    single = refine_sequences(sequences_of(requests, greedy.orders), [1.0] * 12, rank, passes=3)
    assert shared_tokens(single, [list(range(len(s))) for s in single]) == 6
    plan = plan_batch(requests, method="greedy")
    check_plan(plan, [len(request) for request in requests])
    assert shared_tokens(requests, plan.orders) == 7
    first, second = ([r[p] for p in o] for r, o in zip(requests, plan.orders[:2], strict=False))
    assert first[:3] == second[:3] == [3, 4, 5]


@settings(max_examples=80, deadline=None)
@given(requests_strategy, st.lists(st.integers(1, 9), min_size=13, max_size=13))
def test_refined_sequences_are_permutations_and_never_share_less(
    requests: list[list[int]], sizes: list[int]
) -> None:
    weights = [float(size) for size in sizes]
    sequences = [list(request) for request in requests]
    rank = list(range(13))
    identity = [list(range(len(s))) for s in sequences]
    before = shared_tokens(sequences, identity, weights)
    for pairs in (0, 2):
        refined = refine_sequences(sequences, weights, rank, pairs=pairs)
        assert [sorted(s) for s in refined] == [sorted(r) for r in requests]
        assert shared_tokens(refined, identity, weights) >= before


@pytest.mark.parametrize("bad", [{"passes": -1}, {"pairs": -2}, {"pairs": 1.5}, {"passes": True}])
def test_refine_sequences_refuses_bad_counts_and_changes_nothing(bad: dict[str, object]) -> None:
    sequences = [[1, 2], [2, 1]]
    with pytest.raises(ConfigError, match=next(iter(bad))):
        refine_sequences(sequences, [1.0] * 3, [0, 1, 2], **bad)  # type: ignore[arg-type]
    assert sequences == [[1, 2], [2, 1]]


def test_refine_is_off_for_large_batches_and_with_the_builders_schedule() -> None:
    requests = [[1, 2, 3], [2, 3, 4], [1, 5], [1, 6]]
    builder = plan_batch(requests, method="greedy", schedule="builder")  # refine: off
    assert builder == greedy_plan(requests)
    with pytest.raises(ConfigError, match="refine"):
        plan_batch(requests, schedule="builder", refine=True)
    large = [[1, 2, 3], [2, 3, 4], [1, 5], [1, 6]] * (REFINE_UP_TO // 4 + 1)
    assert len(large) > REFINE_UP_TO
    assert plan_batch(large, method="greedy") == plan_batch(large, method="greedy", refine=False)


def test_empty_batch_plans_to_nothing() -> None:
    assert greedy_plan([]) == plan_batch([])


def test_prefix_tree_schedule_keeps_shared_prefixes_together() -> None:
    sequences = [[1, 2], [5, 6], [1, 3], [5, 6, 7], [1, 2, 4]]
    order = prefix_tree_schedule(sequences)
    assert order == (0, 4, 2, 1, 3)


@settings(max_examples=100, deadline=None)
@given(requests_strategy)
def test_trie_add_returns_the_longest_prefix_an_earlier_sequence_had(
    sequences: list[list[int]],
) -> None:
    def shared(a: list[int], b: list[int]) -> int:  # the reference: brute force
        pairs = enumerate(zip(a, b, strict=False))
        return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))

    trie = PrefixTrie()
    for index, sequence in enumerate(sequences):
        expected = max((shared(sequence, earlier) for earlier in sequences[:index]), default=0)
        assert trie.add(sequence, index) == expected
    assert trie.size == len(sequences)


def test_grouped_schedule_is_alg5() -> None:
    sequences = [[5], [1, 2], [1], [9, 8], [1, 3, 4], [5, 6]]
    # groups by first block: 1 → {1, 2, 4} (largest first), 5 → {0, 5}, 9 → {3};
    # within a group longer sequences first.
    assert grouped_schedule(sequences) == (4, 1, 2, 5, 0, 3)


def test_unknown_method_or_schedule_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        plan_batch([[1]], method="magic")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        plan_batch([[1]], schedule="random")  # type: ignore[arg-type]


# -- optimize_batch ----------------------------------------------------------------------


def test_optimize_batch_refines_small_batches_unless_told_not_to(tokenizer: Tokenizer) -> None:
    # the refining case of the planner tests, as documents: greedy leaves "abc" under
    # "a", refining moves it under "bc", the prefix "bcd" starts with
    batch = [
        (blocks("abc"), "q0"),
        (blocks("bcd"), "q1"),
        (blocks("ae"), "q2"),
        (blocks("af"), "q3"),
    ]

    def first_blocks(refine: bool | None) -> str:
        pilot = ContextPilot(PilotConfig(), tokenizer=tokenizer)
        prompts = pilot.optimize_batch(batch, method="greedy", refine=refine)
        text = next(p for p in prompts if p.index == 0).messages[-1]["content"]
        found = {name: text.index(DOCS[name].text) for name in "abc"}
        return "".join(sorted(found, key=found.__getitem__))[:2]

    assert first_blocks(None) == first_blocks(True) == "bc"
    assert first_blocks(False)[0] == "a"


def test_prompts_come_in_execution_order_with_their_input_index(pilot: ContextPilot) -> None:
    batch = [(blocks("abc"), "q0"), (blocks("def"), "q1"), (blocks("cba"), "q2")]
    prompts = pilot.optimize_batch(batch)
    assert sorted(prompt.index for prompt in prompts if prompt.index is not None) == [0, 1, 2]
    by_index = {prompt.index: prompt for prompt in prompts}
    assert by_index[0].messages[-1]["content"].endswith("Question: q0")
    slots = [prompt.index for prompt in prompts]
    assert abs(slots.index(0) - slots.index(2)) == 1  # same blocks: back to back
    assert [b.id for b in by_index[0].blocks] == [b.id for b in by_index[2].blocks]


def test_moved_blocks_get_an_order_note_with_the_original_ranking(pilot: ContextPilot) -> None:
    prompts = pilot.optimize_batch([(blocks("abc"), "q0"), (blocks("cab"), "q1")])
    by_index = {prompt.index: prompt for prompt in prompts}
    moved = [p for p in prompts if [b.id for b in p.blocks] != [b.id for b in p.original_blocks]]
    assert moved
    for prompt in moved:
        ranking = " ".join(block.label for block in prompt.original_blocks)
        assert f"Most relevant first: {ranking}" in prompt.messages[-1]["content"]
    assert by_index[1].original_blocks == tuple(blocks("cab"))


def test_later_requests_report_the_prefix_they_reuse(pilot: ContextPilot) -> None:
    prompts = pilot.optimize_batch([(blocks("abcd"), "q0"), (blocks("dcbe"), "q1")])
    assert prompts[0].stats.blocks_matched == 0
    assert prompts[1].stats.blocks_matched == 3
    assert prompts[1].stats.reusable_tokens > prompts[0].stats.reusable_tokens


def test_batch_prompts_enter_the_context_index(pilot: ContextPilot) -> None:
    pilot.optimize_batch([(blocks("abcd"), "q0"), (blocks("abce"), "q1")])
    online = pilot.optimize(blocks("cbaf"), "later")
    assert online.stats.blocks_matched == 3


def test_conversation_requests_are_planned_like_optimize(pilot: ContextPilot) -> None:
    pilot.optimize(blocks("ab"), "turn one", conversation_id="conv")
    pilot.record_answer("conv", "answer one")
    prompts = pilot.optimize_batch(
        [(blocks("bc"), "turn two", "conv"), (blocks("de"), "other"), (blocks("ed"), "again")]
    )
    turn = next(prompt for prompt in prompts if prompt.index == 0)
    assert prompts[-1] is turn  # after the requests without a conversation
    assert [b.id for b in turn.deduplicated] == ["b"]
    assert turn.conversation_id == "conv"
    assert len(pilot.conversation("conv").turns) == 2


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(sorted(DOCS)), min_size=1, max_size=6, unique=True),
        min_size=1,
        max_size=12,
        unique_by=tuple,
    )
)
def test_every_prompt_holds_each_of_its_blocks_exactly_once(names: list[list[str]]) -> None:
    pilot = ContextPilot(tokenizer="chars")
    batch = [([DOCS[name] for name in request], f"q{i}") for i, request in enumerate(names)]
    prompts = pilot.optimize_batch(batch)
    assert sorted(prompt.index for prompt in prompts) == list(range(len(batch)))  # type: ignore[type-var]
    for prompt in prompts:
        assert prompt.index is not None
        wanted = batch[prompt.index][0]
        content = prompt.messages[-1]["content"]
        assert sorted(block.id for block in prompt.blocks) == sorted(block.id for block in wanted)
        for block in wanted:
            assert content.count(render_block(block)) == 1


def test_reorder_off_keeps_retrieval_order(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(reorder=False), tokenizer=tokenizer)
    prompts = pilot.optimize_batch([(blocks("abc"), "q0"), (blocks("cba"), "q1")])
    for prompt in prompts:
        assert prompt.blocks == prompt.original_blocks
        assert "Most relevant first" not in prompt.messages[-1]["content"]


def test_batch_request_tuples_and_records_are_both_accepted(pilot: ContextPilot) -> None:
    prompts = pilot.optimize_batch([BatchRequest(blocks("ab"), "q0"), [blocks("bc"), "q1"]])
    assert len(prompts) == 2


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "error"),
    [
        ([], EmptyContextError),
        (None, InvalidInputError),
        ("abc", InvalidInputError),
        ([(blocks("ab"), "q"), ([], "empty")], EmptyContextError),
        ([(blocks("ab"), "q"), (blocks("ab"), "q")], DuplicateRequestError),
        ([(blocks("ab"), "q"), ([ContextBlock("other text", id="a")], "q2")], BlockConflictError),
        ([(blocks("ab"),)], InvalidInputError),
        ([(blocks("ab"), 42)], InvalidInputError),
        ([(["not a block"], "q")], InvalidInputError),
        ([(blocks("a"), "q", "c"), (blocks("b"), "q2", "c")], InvalidInputError),
        ([(blocks("a"), "q", "")], InvalidInputError),
    ],
)
def test_bad_batches_raise_typed_errors_and_change_nothing(
    pilot: ContextPilot, batch: object, error: type[Exception]
) -> None:
    pilot.optimize(blocks("ab"), "before")
    before = pilot.index_stats()
    with pytest.raises(error):
        pilot.optimize_batch(batch)  # type: ignore[arg-type]
    assert pilot.index_stats() == before
    assert pilot.optimize(blocks("ab"), "after").stats.blocks_matched == 2


def test_refining_the_builders_own_order_is_refused_before_anything_is_stored(
    pilot: ContextPilot,
) -> None:
    pilot.optimize(blocks("ab"), "before")
    before = pilot.index_stats()
    with pytest.raises(ConfigError, match="refine"):
        pilot.optimize_batch([(blocks("abc"), "q0")], schedule="builder", refine=True)
    assert pilot.index_stats() == before
    assert pilot.optimize(blocks("ab"), "after").stats.blocks_matched == 2


def test_a_block_conflicting_with_an_earlier_call_is_rejected(pilot: ContextPilot) -> None:
    pilot.optimize(blocks("ab"), "before")
    with pytest.raises(BlockConflictError):
        pilot.optimize_batch([([ContextBlock("changed", id="a")], "q")])


def test_an_oversize_block_fails_the_whole_batch(tokenizer: Tokenizer) -> None:
    pilot = ContextPilot(PilotConfig(max_block_tokens=5), tokenizer=tokenizer)
    with pytest.raises(OversizeBlockError):
        pilot.optimize_batch([([ContextBlock("short")], "q"), (blocks("a"), "q2")])
    assert pilot.index_stats().requests == 0


def test_progress_bars_go_to_stderr(
    pilot: ContextPilot, capsys: pytest.CaptureFixture[str]
) -> None:
    pilot.optimize_batch([(blocks("ab"), "q0"), (blocks("ba"), "q1")], progress=True)
    captured = capsys.readouterr()
    assert "batch: prefix tree" in captured.err and "batch: prompts" in captured.err
    assert captured.out == ""
