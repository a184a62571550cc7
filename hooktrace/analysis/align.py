"""Matching two lists of hook calls: which calls of one are the same calls of the other, in order.

One longest-common-subsequence routine (Myers' walk, exact) with an edit budget; past the budget,
k-th calls are paired instead (about linear time and memory, possibly a few more hooks reported as
moved than strictly needed). Used by `diff`; pure functions of two sequences.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Optional, TypeVar

T = TypeVar("T", bound=Hashable)

# Longest common subsequence of two differing lists of one (step, phase, module, kind): exact by
# Myers' O((n + m) * D) walk for D insertions and deletions up to LCS_MAX_EDITS, or up to
# LCS_WORK / (n + m) for short lists (so any short list); past that, k-th calls are paired
# (`pair_by_occurrence`, O(n log n)), which keeps time and memory about linear.
LCS_MAX_EDITS = 64
LCS_WORK = 200_000


def align(a: Sequence[T], b: Sequence[T]) -> list[tuple[int, int]]:
    """Matched (index in a, index in b) pairs of two lists holding the same calls in other orders.

    The lists are cut wherever the calls before the cut are the same in both (as many of each), and
    each piece that differs is matched on its own by `lcs`: a change stays explained where it
    happened (in its own module call) instead of by a far-off pairing that a longest common
    subsequence of the whole, repetitive list may pick; and pieces are short, so it is fast too."""
    if len(a) != len(b):
        return lcs(a, b)
    pairs: list[tuple[int, int]] = []
    balance: dict[T, int] = {}  # calls of each hook in a[start:i] minus those in b[start:i]
    start, differs = 0, False
    for i in range(len(a)):
        x, y = a[i], b[i]
        if x is not y and x != y:
            differs = True
            for key, step in ((x, 1), (y, -1)):
                count = balance.get(key, 0) + step
                if count:
                    balance[key] = count
                else:
                    del balance[key]
        if not balance:
            if differs:
                pairs += [(start + p, start + q) for p, q in lcs(a[start : i + 1], b[start : i + 1])]
            else:
                pairs += [(j, j) for j in range(start, i + 1)]
            start, differs = i + 1, False
    if start < len(a):  # only when the lists do not hold the same calls after all
        pairs += [(start + p, start + q) for p, q in lcs(a[start:], b[start:])]
    return pairs


def lcs(a: Sequence[T], b: Sequence[T]) -> list[tuple[int, int]]:
    """One longest common subsequence of `a` and `b`, as (index in a, index in b) pairs in order.

    The common head and tail are matched first (some longest common subsequence always does). What
    is left is solved exactly when it is small or only a few edits apart (the usual case: a few hooks
    moved); otherwise (long lists with many changes: a module called thousands of times in one step,
    its order changed in most calls) by `pair_by_occurrence`, so that time and memory stay about
    linear in the length of the lists."""
    n, m = len(a), len(b)
    head = 0
    while head < n and head < m and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and a[n - 1 - tail] == b[m - 1 - tail]:
        tail += 1
    mid_a, mid_b = a[head : n - tail], b[head : m - tail]
    size = len(mid_a) + len(mid_b)
    budget = min(size, max(LCS_MAX_EDITS, LCS_WORK // max(size, 1)))
    found = lcs_myers(mid_a, mid_b, budget)
    if found is None:
        found = pair_by_occurrence(mid_a, mid_b)
    return (
        [(i, i) for i in range(head)]
        + [(head + i, head + j) for i, j in found]
        + [(n - tail + t, m - tail + t) for t in range(tail)]
    )


def lcs_myers(a: Sequence[T], b: Sequence[T], max_edits: int) -> Optional[list[tuple[int, int]]]:
    """Exact, by Myers' greedy walk ("An O(ND) difference algorithm", 1986): O((n + m) * D) time and
    O(D²) memory for D insertions plus deletions; None when D > max_edits."""
    n, m = len(a), len(b)
    off = max_edits + 1
    v = [0] * (2 * max_edits + 3)  # v[off + k]: furthest x reached on diagonal k = x - y
    rounds: list[list[int]] = []  # v[off - d - 1 : off + d + 2] as it was when round d began
    for d in range(max_edits + 1):
        rounds.append(v[off - d - 1 : off + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]  # one more item of b
            else:
                x = v[off + k - 1] + 1  # one more item of a
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                return myers_matches(rounds, n, m)
    return None


def myers_matches(rounds: list[list[int]], n: int, m: int) -> list[tuple[int, int]]:
    """Walk Myers' rounds back from (n, m): the matched (index in a, index in b) pairs."""
    pairs: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(len(rounds) - 1, -1, -1):
        v = rounds[d]  # v[k + d + 1] for diagonals k in -d-1 .. d+1
        k = x - y
        if k == -d or (k != d and v[k - 1 + d + 1] < v[k + 1 + d + 1]):
            prev_k = k + 1
        else:
            prev_k = k - 1
        prev_x = v[prev_k + d + 1]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x -= 1
            y -= 1
            pairs.append((x, y))
        x, y = prev_x, prev_y
    pairs.reverse()
    return pairs


def pair_by_occurrence(a: Sequence[T], b: Sequence[T]) -> list[tuple[int, int]]:
    """A common subsequence in O(n log n): the k-th call of a hook in `a` is paired with its k-th call
    in `b`, and the longest run of pairs in increasing order in both is kept (patience sorting). It is
    the longest when no hook repeats; with repeats it can be a little shorter, so a few more hooks
    may be reported as moved than strictly needed."""
    positions: dict[T, list[int]] = {}
    for j, k in enumerate(b):
        positions.setdefault(k, []).append(j)
    seen: Counter[T] = Counter()
    pairs: list[tuple[int, int]] = []
    for i, k in enumerate(a):
        nth = seen[k]
        seen[k] += 1
        at = positions.get(k)
        if at is not None and nth < len(at):
            pairs.append((i, at[nth]))
    tails: list[int] = []  # tails[L]: smallest b index ending an increasing run of length L + 1
    tail_pair: list[int] = []  # index into `pairs` of that run's last pair
    previous = [-1] * len(pairs)
    for p, (_, j) in enumerate(pairs):
        L = bisect.bisect_left(tails, j)
        if L == len(tails):
            tails.append(j)
            tail_pair.append(p)
        else:
            tails[L] = j
            tail_pair[L] = p
        previous[p] = tail_pair[L - 1] if L else -1
    kept: list[tuple[int, int]] = []
    p = tail_pair[-1] if tail_pair else -1
    while p >= 0:
        kept.append(pairs[p])
        p = previous[p]
    kept.reverse()
    return kept
