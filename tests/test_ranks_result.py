"""`run --nproc` without processes: rank file names, options, the comparison of hand-built traces,
the result model's states, exit codes and summary, and the checks made before anything starts.
The launches themselves are in test_ranks.py."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import pytest

from hooktrace.analysis.ranks import compare_pair, compare_ranks
from hooktrace.options import UsageError
from hooktrace.ranks import (
    FAILED,
    OK,
    STOPPED,
    USAGE,
    RankOutcome,
    RanksResult,
    launch,
    rank_trace_path,
    run_ranks,
    worker,
)
from hooktrace.schema import Event, Hook, Meta, Trace

# -- pure: paths, options, comparison ---------------------------------------------------------------


def test_rank_trace_path() -> None:
    assert rank_trace_path("out/run.json", 1) == "out/run.rank1.json"
    assert rank_trace_path("run.svg", 0) == "run.rank0.json"
    assert rank_trace_path("run", 3) == "run.rank3.json"
    assert rank_trace_path("some.dir/run", 0) == "some.dir/run.rank0.json"
    assert rank_trace_path("run.json.gz", 1) == "run.rank1.json.gz"  # -o x.json.gz keeps the compression


def test_the_run_options_reach_the_driver_as_given() -> None:
    @dataclasses.dataclass
    class Options:
        steps: int = 3
        input_shapes: tuple = ("4x8",)

    assert launch._plain(Options()) == {"steps": 3, "input_shapes": ["4x8"]}
    assert launch._plain({"steps": 2, "backward": False}) == {"steps": 2, "backward": False}
    assert launch._plain(None) == {}
    with pytest.raises(TypeError):
        launch._plain({"dtype": object()})  # not something a worker could receive


def test_a_worker_started_by_hand_says_how_to_start_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert worker.main([]) == 2
    assert "hooktrace run --nproc N" in capsys.readouterr().err


def _hook(hid: int, name: str, module: str = "fc", kind: str = "forward", **kw: object) -> Hook:
    return Hook(id=hid, kind=kind, scope="module", module=module, name=name, **kw)  # type: ignore[arg-type]


def _trace(hooks: list[Hook], fired: list[int], rank: int) -> Trace:
    """A trace whose hook events fire `fired` (hook ids) in order, all at step 0 in forward."""
    by_id = {h.id: h for h in hooks}
    events = [
        Event(i, 0, "hook", "forward", by_id[hid].module, hid, by_id[hid].kind, 1, i, 1, False, None)
        for i, hid in enumerate(fired)
    ]
    return Trace(meta=Meta(rank=rank, world_size=2), hooks=hooks, events=events)


def test_ranks_with_other_handle_ids_but_the_same_hooks_agree() -> None:
    a = _trace([_hook(1, "pre", kind="forward_pre"), _hook(2, "post")], [1, 2], rank=0)
    b = _trace([_hook(7, "pre", kind="forward_pre"), _hook(9, "post")], [7, 9], rank=1)
    (only,) = compare_ranks({0: a, 1: b})
    assert only.agree and only.divergence is None
    assert only.events == (2, 2)


def test_extra_hook_on_one_rank_is_the_first_divergence_and_is_named() -> None:
    a = _trace([_hook(1, "pre", kind="forward_pre"), _hook(2, "post")], [1, 2], rank=0)
    b = _trace([_hook(1, "pre", kind="forward_pre"), _hook(2, "post"), _hook(3, "spy")], [1, 3, 2], rank=1)
    c = compare_pair(a, b, 0, 1)
    assert not c.agree
    d = c.divergence
    assert d is not None
    assert (d.rank, d.reference, d.index, d.step, d.phase, d.module, d.kind) == (
        1,
        0,
        1,
        0,
        "forward",
        "fc",
        "forward",
    )
    assert d.expected is not None and d.expected.startswith("post (forward hook on module 'fc'")
    assert d.got is not None and d.got.startswith("spy (forward hook on module 'fc'")
    assert [(r.label.split()[0], r.reference_count, r.rank_count) for r in c.registrations] == [("spy", 0, 1)]
    assert [(r.label.split()[0], r.reference_count, r.rank_count) for r in c.calls] == [("spy", 0, 1)]
    text = c.describe()
    assert "only on rank 1: spy" in text and "called 0x on rank 0 but 1x on rank 1: spy" in text


def test_different_call_counts_and_a_shorter_rank() -> None:
    hooks = [_hook(1, "pre", kind="forward_pre"), _hook(2, "post")]
    a = _trace(hooks, [1, 2, 1, 2], rank=0)
    b = _trace(hooks, [1, 2, 1], rank=1)
    c = compare_pair(a, b, 0, 1)
    assert c.registrations == []
    assert [(r.label.split()[0], r.reference_count, r.rank_count) for r in c.calls] == [("post", 2, 1)]
    d = c.divergence
    assert d is not None and d.index == 3 and d.got is None and d.expected is not None
    assert "rank 1 (got):      no more hooks" in d.describe()


def test_same_hooks_in_another_order_diverge_where_the_order_changes() -> None:
    hooks = [_hook(1, "a"), _hook(2, "b"), _hook(3, "c")]
    c = compare_pair(_trace(hooks, [1, 2, 3], 0), _trace(hooks, [1, 3, 2], 1), 0, 1)
    assert c.registrations == [] and c.calls == []
    assert c.divergence is not None and c.divergence.index == 1
    assert c.diff is not None and not c.diff.equal  # `hooktrace diff` sees the move as well
    assert not c.agree


def test_the_divergence_heading_describes_the_differing_rank_s_event() -> None:
    """Rank 1 ran a backward_pre hook on `head` where rank 0 ran a forward hook on `fc`: the heading
    says where rank 1 was (its module, kind), each rank's own hook on its line."""
    a = _trace([_hook(1, "pre", kind="forward_pre"), _hook(2, "post")], [1, 2], rank=0)
    b = _trace(
        [_hook(1, "pre", kind="forward_pre"), _hook(5, "spy", module="head", kind="backward_pre")], [1, 5], 1
    )
    d = compare_pair(a, b, 0, 1).divergence
    assert d is not None and (d.module, d.kind) == ("head", "backward_pre")
    heading = d.describe().splitlines()[0]
    assert (
        heading == "first divergence: rank 1 at hook event #1 (step 0, forward, module 'head', backward_pre):"
    )
    # a rank whose trace ended: the reference's event is where it stopped
    d = compare_pair(a, _trace(a.hooks, [1], 1), 0, 1).divergence
    assert d is not None and (d.module, d.kind, d.got) == ("fc", "forward", None)


def test_summary_and_exit_code_of_agreeing_ranks() -> None:
    hooks = [_hook(1, "pre", kind="forward_pre")]
    traces = {r: _trace(hooks, [1], r) for r in (0, 1)}
    outcomes = [RankOutcome(r, OK, trace_path=f"t.rank{r}.json", trace=traces[r]) for r in (0, 1)]
    result = RanksResult(nproc=2, show_rank=1, ranks=outcomes, comparisons=compare_ranks(traces))
    assert result.exit_code == 0 and result.shown is traces[1]
    assert "ranks agree: same hook order on ranks 0, 1 (1 hook call each)" in result.summary()
    for o in outcomes:
        o.notes = ["backward skipped (--no-backward)"]
    outcomes[1].notes.append("only here")
    summary = result.summary()
    assert "note (every rank): backward skipped (--no-backward)" in summary
    assert "note (rank 1): only here" in summary
    outcomes[1].state, outcomes[1].error = FAILED, "boom"
    assert result.exit_code == 1 and "ranks failed: rank 1 failed" in result.summary()


def test_an_interrupted_run_exits_128_plus_the_signal_and_compares_nothing() -> None:
    hooks = [_hook(1, "pre", kind="forward_pre"), _hook(2, "post")]
    traces = {0: _trace(hooks, [1, 2], 0), 1: _trace(hooks, [1], 1)}  # stopped at different points
    outcomes = [RankOutcome(r, STOPPED, "stopped by SIGTERM", trace=traces[r]) for r in (0, 1)]
    result = RanksResult(nproc=2, show_rank=0, ranks=outcomes, comparisons=compare_ranks(traces))
    assert result.exit_code == 1 and "ranks diverge" in result.summary()
    result.interrupted = signal.SIGTERM
    assert result.exit_code == 143 and result.usage_error is None
    summary = result.summary()
    assert "interrupted by SIGTERM: stopped every rank" in summary and "ranks diverge" not in summary
    assert "hook orders not compared: the ranks were interrupted" in summary
    assert "keep every rank's trace with -o PATH" in summary  # none was kept: no -o
    result.interrupted = signal.SIGINT
    assert result.exit_code == 130


def test_the_rank_that_caused_a_failure_is_named_not_the_ones_that_waited_for_it() -> None:
    waited = "forward hook sync raised RuntimeError: [gloo] Timed out waiting 4000ms for recv operation"
    closed = "grad hook f raised RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    own = "forward_pre hook boom raised RuntimeError: boom on rank 1"
    stopped = "forward_pre hook stall raised RankTerminated: stopped by SIGTERM"

    def result(*outcomes: RankOutcome) -> RanksResult:
        return RanksResult(nproc=len(outcomes), show_rank=0, ranks=list(outcomes), comparisons=[])

    # rank 1 raised first; rank 0 then lost its peer mid-collective (it reported later, but so what)
    r = result(RankOutcome(0, FAILED, error=closed, ended_at=1.0), RankOutcome(1, FAILED, own, ended_at=2.0))
    assert r.first_failure is r.ranks[1]
    assert "first to fail: rank 1 (failed): forward_pre hook boom" in r.summary()
    # rank 0 timed out in a collective that rank 1, stuck in a hook, never reached
    r = result(
        RankOutcome(0, FAILED, error=waited, ended_at=1.0),
        RankOutcome(1, STOPPED, stopped, ended_at=2.0),
    )
    assert r.first_failure is r.ranks[1]
    assert "rank 1 held the others up: they waited for it" in r.summary()
    # two ranks failing on their own: the earlier one
    r = result(RankOutcome(0, FAILED, error=own, ended_at=3.0), RankOutcome(1, FAILED, own, ended_at=2.0))
    assert r.first_failure is r.ranks[1]


def test_bad_arguments_are_usage_errors_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--rank 2"):
        run_ranks("x.py", 2, out=None, timeout=10, show_rank=2)
    with pytest.raises(UsageError, match="--nproc 0"):
        run_ranks("x.py", 0, out=None, timeout=10, show_rank=0)
    with pytest.raises(UsageError, match="--timeout"):
        run_ranks("x.py", 2, out=None, timeout=0, show_rank=0)
    model = tmp_path / "model.py"
    model.write_text("def make():\n    pass\n")
    with pytest.raises(UsageError, match="does not exist"):
        run_ranks(str(model), 2, out=str(tmp_path / "no" / "run.json"), timeout=10, show_rank=0)
    with pytest.raises(UsageError, match="file not found: .*missing.py"):
        run_ranks(str(tmp_path / "missing.py"), 2, out=None, timeout=10, show_rank=0)


def test_usage_error_on_every_rank_is_exit_2_with_its_message() -> None:
    outcomes = [
        RankOutcome(0, USAGE, error="x.py has no attribute 'nope'"),
        RankOutcome(1, STOPPED, error="stopped by SIGTERM: the launcher stops every rank when one fails"),
    ]
    result = RanksResult(nproc=2, show_rank=0, ranks=outcomes, comparisons=[])
    assert result.usage_error == "x.py has no attribute 'nope'" and result.exit_code == 2
    outcomes[1].state = OK  # one rank ran: not a usage error of the whole run
    assert result.usage_error is None and result.exit_code == 1
