"""The least input cost any prompt strategy could pay for a cloud workload: a lower
bound that tells which cost targets are reachable at all.

Whatever the strategy, every request must give the model what the unmodified request
gives it: the system prompt, every document its conversation has retrieved so far
(this turn's and earlier turns'), and every question and answer so far. Call each of
these texts a *unit*. Two bounds hold for any strategy, and the larger is reported:

* **per unit**: let ``k`` be the number of requests that must carry a unit (over the
  whole workload, so a document two conversations retrieve counts once). It costs at
  least ``input`` per token when ``k = 1``, and ``min(k · input, write + (k − 1) ·
  read)`` when ``k > 1`` (sent uncached every time, or written once and read back
  every later time; on OpenAI a write costs ``input``);
* **per request** (prefix-aware): a request reads from the cache one prefix of *one*
  earlier request's prompt (a cache entry is a prefix some request wrote), so it reads
  at most the units it shares with its best earlier partner; every token it carries
  costs at least ``input``, less what reading it saves. A token of a unit read ``m``
  times saves ``input − read`` each time, but the unit was written once at the
  premium ``write − input``, so each read saves at most ``input − read − (write −
  input) / (k − 1)`` (``m ≤ k − 1``), and nothing when that is negative. Each request
  is credited the most its best partner's shared units could save.

Both are optimistic everywhere a rule could only add cost: no time-to-live, no
minimum cacheable prefix or 128-token step, no order inside a prompt, no markup,
notes or labels, each unit's tokens counted on its own text. No strategy that keeps
the same information in its prompts pays less, so ``baseline / bound`` is the most
any strategy could save against the baseline.

Both let a later turn read its new documents from another conversation's prompts.
Chat prompts cannot: :func:`least_chat_append_cost` bounds the strategies whose every
turn's prompt starts with the conversation's previous prompt, whole (the chat-history
convention; the byte-stable prefixes the pilot keeps), and carries only the units its
request must carry. A unit a conversation first carries at a later turn then follows
that turn's own history — the previous question, unique to the conversation — so no
earlier prompt of any conversation starts the same way, and nothing can serve it from
the cache: it is paid, once written, then read at the conversation's later turns
(``min(k · input, write + (k − 1) · read)`` over its ``k`` turns). Only a first turn
reads across conversations, at most the system prompt and the first-turn documents it
shares with one earlier conversation (the part of a prompt before its first
question), each such token read once instead of paid (saving ``write − read`` where
the conversation goes on, ``input − read`` where it does not). With the provider's
minimum cacheable prefix (``min_prefix_tokens``), a first turn sharing less than that
with every earlier one reads nothing, and all first turns together read no more than
:func:`~.optimum.separation_bound` allows their heads (in any order, counting only
reads of at least the minimum); the savings then go to the first turns that save most
per token, each up to its own share. Optimistic in the same ways otherwise.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from ..cloud import ModelPrice
from ..sim.replay import synthetic_answer
from .cloud_workloads import CloudWorkload
from .optimum import best_partner_shares, separation_bound

__all__ = [
    "least_chat_append_cost",
    "least_chat_append_costs",
    "least_input_cost",
    "required_units",
]


def required_units(workload: CloudWorkload) -> list[tuple[str, ...]]:
    """The units (texts) each request must carry, in send order (see the module
    docstring): the system prompt first, each unit once however often retrieved."""
    carried: list[tuple[str, ...]] = []
    history: dict[str, tuple[str, ...]] = {}  # conversation -> its units so far
    for timed in workload.requests:
        request = timed.request
        earlier = history.get(request.session, ()) if request.session is not None else ()
        units = dict.fromkeys([workload.system_prompt, *earlier])
        units.update(dict.fromkeys(workload.corpus[doc_id] for doc_id in request.doc_ids))
        units[request.query] = None
        carried.append(tuple(units))
        if request.session is not None:
            history[request.session] = (*units, synthetic_answer(request))
    return carried


def _per_unit(carried: list[tuple[str, ...]], price: ModelPrice, tokens: Counter[str]) -> float:
    write = _write(price)
    counts = Counter(unit for units in carried for unit in units)
    total = 0.0
    for unit, k in counts.items():
        per_token = (
            price.input if k == 1 else min(k * price.input, write + (k - 1) * price.cache_read)
        )
        total += tokens[unit] * per_token
    return total


def _per_request(carried: list[tuple[str, ...]], price: ModelPrice, tokens: Counter[str]) -> float:
    premium = _write(price) - price.input
    counts = Counter(unit for units in carried for unit in units)
    saving = {
        unit: tokens[unit] * max(0.0, price.input - price.cache_read - premium / (k - 1))
        for unit, k in counts.items()
        if k > 1
    }
    holders: defaultdict[str, list[int]] = defaultdict(list)  # unit -> earlier requests
    total = 0.0
    for number, units in enumerate(carried):
        saved: defaultdict[int, float] = defaultdict(float)
        for unit in units:
            for earlier in holders[unit]:
                saved[earlier] += saving[unit]
        total += sum(tokens[unit] for unit in units) * price.input - max(saved.values(), default=0)
        for unit in units:
            holders[unit].append(number)
    return total


def _write(price: ModelPrice) -> float:
    """A cache write's price per token (``input`` where there is no premium)."""
    return price.cache_write_5m if price.cache_write_5m is not None else price.input


def least_input_cost(
    workload: CloudWorkload, price: ModelPrice, count_tokens: Callable[[str], int]
) -> float:
    """The larger of the two lower bounds of the module docstring, in USD (``price``
    per million tokens, ``count_tokens`` the tokenizer's length of a text)."""
    carried = required_units(workload)
    return _any_prompt(carried, price, _token_counts(carried, count_tokens)) / 1e6


def _token_counts(
    carried: list[tuple[str, ...]], count_tokens: Callable[[str], int]
) -> Counter[str]:
    return Counter({unit: count_tokens(unit) for units in carried for unit in units})


def _any_prompt(carried: list[tuple[str, ...]], price: ModelPrice, tokens: Counter[str]) -> float:
    """The larger of the per-unit and per-request bounds, in USD per million."""
    return max(_per_unit(carried, price, tokens), _per_request(carried, price, tokens))


def least_chat_append_cost(
    workload: CloudWorkload,
    price: ModelPrice,
    count_tokens: Callable[[str], int],
    *,
    min_prefix_tokens: int = 0,
) -> float:
    """The least input cost, in USD, of the strategies whose turns extend the
    conversation's previous prompt and carry only what their request must (the module
    docstring); ``price`` per million tokens, ``count_tokens`` the tokenizer's length,
    ``min_prefix_tokens`` the shortest prefix the provider caches (0: any)."""
    least, _ = least_chat_append_costs(
        workload, price, count_tokens, min_prefix_tokens=min_prefix_tokens
    )
    return least


def least_chat_append_costs(
    workload: CloudWorkload,
    price: ModelPrice,
    count_tokens: Callable[[str], int],
    *,
    min_prefix_tokens: int = 0,
) -> tuple[float, float]:
    """:func:`least_chat_append_cost`, and the same bound with first turns reading
    nothing from other conversations (what the bound owes to such reads is the
    difference), from one pass."""
    write = _write(price)
    conversations: defaultdict[str, list[int]] = defaultdict(list)  # name -> request numbers
    for number, timed in enumerate(workload.requests):
        conversations[_conversation(timed.request.session, number)].append(number)
    carried = required_units(workload)
    tokens = _token_counts(carried, count_tokens)
    total = 0.0
    for numbers in conversations.values():
        first_turn: dict[str, int] = {}  # unit -> the turn that first carries it
        for turn, number in enumerate(numbers):
            for unit in carried[number]:
                first_turn.setdefault(unit, turn)
        for unit, turn in first_turn.items():
            later = len(numbers) - 1 - turn
            paid = (later + 1) * price.input
            total += tokens[unit] * (min(paid, write + later * price.cache_read) if later else paid)
    # the class is narrower than "any prompt": its least cost is at least that bound too
    floor = _any_prompt(carried, price, tokens)
    without_reads = max(total, floor) / 1e6
    starts = sorted(numbers[0] for numbers in conversations.values())
    goes_on = {numbers[0]: len(numbers) > 1 for numbers in conversations.values()}
    heads = [
        [unit for unit in carried[number] if unit != workload.requests[number].request.query]
        for number in starts
    ]
    codes: dict[str, int] = {}
    coded = [[codes.setdefault(unit, len(codes)) for unit in head] for head in heads]
    sizes = {code: float(tokens[unit]) for unit, code in codes.items()}
    shares = best_partner_shares(coded, sizes, earlier_only=True)
    offers = sorted(
        (
            (max(0.0, (write if goes_on[number] else price.input) - price.cache_read), float(share))
            for number, share in zip(starts, shares, strict=True)
            if share >= min_prefix_tokens
        ),
        reverse=True,
    )
    readable = separation_bound(coded, sizes, min_prefix=min_prefix_tokens)
    for saving, share in offers:  # the most saving per token first, up to what is readable
        read = min(share, readable)
        total -= read * saving
        readable -= read
        if readable <= 0:
            break
    return max(total, floor) / 1e6, without_reads


def _conversation(session: str | None, number: int) -> str:
    """The conversation a request belongs to (a request without one is its own)."""
    return f"s:{session}" if session is not None else f"r:{number}"
