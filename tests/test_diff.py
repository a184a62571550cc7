"""diff_traces: hook order per (step, phase, module, kind), ignoring times, ids, threads and paths."""

from __future__ import annotations

import copy
from typing import Any

from hooktrace.analysis.diff import TraceDiff, diff_traces
from hooktrace.schema import Event, Trace
from tests.test_renderers_all import Builder, layers, recompute_two_steps, two_layer


def swap(trace: Trace, i: int, j: int) -> Trace:
    """The same trace with events i and j fired the other way round (seq and times stay in place)."""
    t = copy.deepcopy(trace)
    a, b = t.events[i], t.events[j]
    t.events[i] = b._replace(seq=a.seq, start_ns=a.start_ns)
    t.events[j] = a._replace(seq=b.seq, start_ns=b.start_ns)
    return t


def renumber(trace: Trace, events: list[Event]) -> Trace:
    t = copy.deepcopy(trace)
    t.events = [e._replace(seq=i) for i, e in enumerate(events)]
    return t


def kinds(d: TraceDiff) -> list[str]:
    return [x.change for x in d.differences]


def test_identical_traces_are_equal() -> None:
    for make in (two_layer, recompute_two_steps, lambda: layers(3, steps=2)):
        d = diff_traces(make(), make())
        assert d.equal and d.differences == [] and d.first_divergence is None
        assert d.summary().startswith("same hook order:")


def test_times_ids_threads_and_paths_are_ignored() -> None:
    a = two_layer()
    b = copy.deepcopy(a)
    shift = {h.id: h.id + 1000 for h in b.hooks}
    for h in b.hooks:
        h.id = shift[h.id]
        h.defined_at = f"/elsewhere/{h.defined_at}"
        h.registered_at = "/somewhere/else.py:99"
    b.events = [
        e._replace(
            hook=shift.get(e.hook) if e.hook is not None else None,
            thread=12345,
            start_ns=e.start_ns * 3 + 17,
            duration_ns=e.duration_ns + 5,
        )
        for e in b.events
    ]
    b.meta.created = "2030-01-01T00:00:00+00:00"
    assert diff_traces(a, b).equal


def test_moved_hook_is_named_in_the_first_divergence() -> None:
    a = two_layer()
    b = swap(a, 4, 5)  # fc1's prepended 'early' now fires after 'cast_inputs'
    d = diff_traces(a, b)
    assert not d.equal
    assert kinds(d) == ["moved"]
    first = d.first_divergence
    assert first is not None
    assert first.startswith("step 0, forward, module 'fc1', forward_pre hooks: ")
    assert "expected 'early' at position 2, got 'cast_inputs'" in first
    assert "moved from position" in first
    moved = d.differences[0]
    assert (
        moved.hook in ("'early'", "'cast_inputs'") and moved.module == "fc1" and moved.kind == "forward_pre"
    )
    summary = d.summary().splitlines()
    assert summary[0].startswith("hook order differs: 1 difference")
    assert summary[1] == f"first divergence: {first}"


def test_hook_moved_far_is_the_one_named() -> None:
    b = Builder(("fc", "Linear"))
    hs = [b.hook("forward_pre", "fc", name) for name in ("a", "b", "c", "d")]
    b.enter("fc")
    for h in hs:
        b.fire(h, "fc")
    b.exit("fc")
    a = b.trace()
    order = [a.events[0], a.events[4], a.events[1], a.events[2], a.events[3], a.events[5]]  # 'd' first
    d = diff_traces(a, renumber(a, order))
    assert [x.change for x in d.differences] == ["moved"]
    assert d.differences[0].hook == "'d'"
    assert "'d' moved from position 4 to 1 of 4" in str(d.first_divergence)
    assert "expected 'a' at position 1, got 'd'" in str(d.first_divergence)


def test_added_removed_and_count() -> None:
    a = two_layer()
    without = renumber(a, [e for e in a.events if e.seq != 17])  # the grad hook did not fire
    d = diff_traces(a, without)
    assert kinds(d) == ["removed"]
    assert "'weight_grad' (tensor hook on fc1.weight) did not fire" in str(d.differences[0])
    assert str(d.differences[0]).startswith("step 0, backward, module 'fc1', grad hooks")

    d2 = diff_traces(without, a)
    assert kinds(d2) == ["added"] and "'weight_grad'" in str(d2.first_divergence)

    twice = renumber(a, a.events[:19] + [a.events[18]])
    d3 = diff_traces(a, twice)
    assert kinds(d3) == ["count"]
    assert "'grad_fc1' fired 2×, expected 1×" in str(d3.differences[0])


def test_flag_and_scope_changes() -> None:
    a = two_layer()
    b = copy.deepcopy(a)
    early = next(h for h in b.hooks if h.name == "early")
    early.prepend = False
    after = next(h for h in b.hooks if h.name == "after_fc1")
    after.with_kwargs = False
    d = diff_traces(a, b)
    assert kinds(d) == ["flags", "flags"]
    assert "'early' (module hook): prepend True → False" in str(d.differences[0])
    assert "with_kwargs True → False" in str(d.differences[1])
    assert d.first_divergence == str(d.differences[0])

    c = copy.deepcopy(a)
    pre = next(h for h in c.hooks if h.name == "cast_inputs")
    pre.scope, pre.module = "global", None
    d2 = diff_traces(a, c)
    assert "scope" in kinds(d2)
    assert "'cast_inputs' (global) is now global scope, was module" in str(d2.first_divergence)


def test_duplicate_hooks_are_told_apart_by_registration_order() -> None:
    b = Builder(("fc", "Linear"))
    first, second = b.hook("forward", "fc", "log"), b.hook("forward", "fc", "log")
    b.enter("fc")
    b.fire(first, "fc")
    b.fire(second, "fc")
    b.exit("fc")
    a = b.trace()
    d = diff_traces(a, swap(a, 1, 2))
    assert kinds(d) == ["moved"] and "'log' #2" in str(d.first_divergence)


def test_missing_step_and_phase_are_one_difference_each() -> None:
    d = diff_traces(layers(2, steps=2), layers(2))
    assert kinds(d) == ["step"]
    assert d.first_divergence == "step 1: only in the expected trace (55 hook calls)"
    a = two_layer()
    forward_only = renumber(a, [e for e in a.events if e.phase == "forward"])
    d2 = diff_traces(a, forward_only)
    assert kinds(d2) == ["phase"]
    assert d2.first_divergence == "step 0, backward: only in the expected trace (3 hook calls)"


def test_first_divergence_is_the_earliest() -> None:
    a = two_layer()
    b = swap(a, 4, 5)  # forward
    b = renumber(b, [e for e in b.events if e.seq != 17])  # and backward
    d = diff_traces(a, b)
    assert kinds(d) == ["moved", "removed"]
    assert "forward" in str(d.first_divergence) and "backward" in str(d.differences[1])


def _tiny_run(prepend: bool) -> Trace:
    import torch  # a dependency: the capture is always there

    import hooktrace

    def cast(*_: Any) -> None:
        return None

    def early(*_: Any) -> None:
        return None

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    model[0].register_forward_pre_hook(cast)
    model[0].register_forward_pre_hook(early, prepend=prepend)
    model[2].register_full_backward_hook(lambda *_: None)
    with hooktrace.trace(model) as t:
        model(torch.randn(2, 3)).sum().backward()
    return t.trace


def test_real_runs() -> None:
    assert diff_traces(_tiny_run(True), _tiny_run(True)).equal
    d = diff_traces(_tiny_run(True), _tiny_run(False))
    assert not d.equal
    assert "moved" in kinds(d) and "flags" in kinds(d)
    assert "module '0', forward_pre hooks" in str(d.first_divergence)
    assert "'_tiny_run.<locals>.early'" in str(d.first_divergence)


# -- long lists: a module called thousands of times in one step ----------------------------------------


def looped(calls: int, swapped: frozenset[int] = frozenset()) -> Trace:
    """One step in which `fc` is called `calls` times, its pre-hooks 'a' then 'b' (swapped in the calls
    listed)."""
    b = Builder(("fc", "Linear"))
    ha, hb = b.hook("forward_pre", "fc", "a"), b.hook("forward_pre", "fc", "b")
    for c in range(calls):
        b.enter("fc")
        for h in (hb, ha) if c in swapped else (ha, hb):
            b.fire(h, "fc")
        b.exit("fc")
    return b.trace()


def moved_positions(d: TraceDiff) -> list[str]:
    return [x.detail.split(" moved ")[1] for x in d.differences if x.change == "moved"]


def test_few_changes_in_a_long_list_are_found_exactly() -> None:
    a = looped(3000)
    swapped = (5, 1700, 2999)
    d = diff_traces(a, looped(3000, frozenset(swapped)))
    assert kinds(d) == ["moved"] * 3
    # call c has its hooks at positions 2c + 1 and 2c + 2: each swap is one hook moved by one place
    moves = [tuple(int(w) for w in m.split()[2:5:2]) for m in moved_positions(d)]  # "from position P to Q"
    assert sorted(tuple(sorted(m)) for m in moves) == [(2 * c + 1, 2 * c + 2) for c in swapped]
    assert all(m.endswith("of 6000") for m in moved_positions(d))
    assert "expected 'a' at position 11, got 'b'" in str(d.first_divergence)


def test_many_changes_in_a_long_list_are_each_explained_in_place() -> None:
    """Every other call changed (no timing asserted; this used to build a 6000 x 6000 table)."""
    a = looped(3000)
    b = looped(3000, frozenset(range(0, 3000, 2)))
    d = diff_traces(a, b)
    assert kinds(d) == ["moved"] * 1500
    moves = [tuple(sorted(int(w) for w in m.split()[2:5:2])) for m in moved_positions(d)]
    assert sorted(moves) == [(2 * c + 1, 2 * c + 2) for c in range(0, 3000, 2)]
    summary = d.summary().splitlines()  # one line per hook and list, not 1500
    assert len(summary) == 4 and summary[-1] == "    ×1499 more moves among these forward_pre hooks"


def test_long_differing_stretches_fall_back_to_pairing_calls(monkeypatch: Any) -> None:
    """Past Myers' edit budget, k-th calls are paired: still a valid report."""
    from hooktrace.analysis import align

    monkeypatch.setattr(align, "LCS_MAX_EDITS", 0)
    monkeypatch.setattr(align, "LCS_WORK", 0)
    b = Builder(("fc", "Linear"))
    hs = [b.hook("forward_pre", "fc", name) for name in "abcdef"]
    b.enter("fc")
    for h in hs:
        b.fire(h, "fc")
    b.exit("fc")
    a = b.trace()
    order = [a.events[0], *a.events[2:7], a.events[1], a.events[7]]  # 'a' last
    d = diff_traces(a, renumber(a, order))
    assert kinds(d) == ["moved"] and "'a' moved from position 1 to 6 of 6" in str(d.first_divergence)


def test_longest_common_subsequence_variants_agree_with_brute_force() -> None:
    import random

    from hooktrace.analysis import align as D

    def lcs_length(a: list[int], b: list[int]) -> int:
        row = [0] * (len(b) + 1)
        for x in a:
            prev = 0
            for j, y in enumerate(b):
                prev, row[j + 1] = row[j + 1], prev + 1 if x == y else max(row[j + 1], row[j])
        return row[-1]

    def common(a: list[int], b: list[int], pairs: list[tuple[int, int]]) -> bool:
        ordered = all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))
        return ordered and all(a[i] == b[j] for i, j in pairs)

    rng = random.Random(5)
    for _ in range(2000):
        alphabet = rng.randint(1, 6)
        a = [rng.randrange(alphabet) for _ in range(rng.randint(0, 25))]
        if rng.random() < 0.5:
            b = a[:]
            for _ in range(rng.randint(0, 3)):
                if b:
                    i, j = rng.randrange(len(b)), rng.randrange(len(b))
                    b[i], b[j] = b[j], b[i]
        else:
            b = [rng.randrange(alphabet) for _ in range(rng.randint(0, 25))]
        best = lcs_length(a, b)
        for pairs in (D.lcs_myers(a, b, 50), D.lcs(a, b)):  # type: ignore[arg-type]
            assert pairs is not None and len(pairs) == best and common(a, b, pairs)
        capped = D.lcs_myers(a, b, 2)  # type: ignore[arg-type]
        assert capped is None or len(capped) == best
        paired = D.pair_by_occurrence(a, b)  # type: ignore[arg-type]
        assert common(a, b, paired) and len(paired) <= best
        if len(set(a)) == len(a) and len(set(b)) == len(b):
            assert len(paired) == best  # exact when nothing repeats
