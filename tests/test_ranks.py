"""`hooktrace run --nproc N` machinery: ranks through torch.distributed.run, compared hook orders.

The first tests are pure (hand-built traces, no processes). The rest launch 2 real ranks over gloo
on CPU; each launch takes a while (the launcher and every rank import torch), so each run is made
once per module and several tests read it.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from hooktrace.analysis.ranks import compare_pair, compare_ranks
from hooktrace.ranks import (
    DIED,
    FAILED,
    HUNG,
    OK,
    STOPPED,
    USAGE,
    RankOutcome,
    RanksResult,
    rank_trace_path,
    run_options,
    run_ranks,
)
from hooktrace.ranks import launch as ranks
from hooktrace.schema import Event, Hook, Meta, Trace, load
from hooktrace.target import UsageError

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


# -- pure: paths, options, comparison ---------------------------------------------------------------


def test_rank_trace_path() -> None:
    assert rank_trace_path("out/run.json", 1) == "out/run.rank1.json"
    assert rank_trace_path("run.svg", 0) == "run.rank0.json"
    assert rank_trace_path("run", 3) == "run.rank3.json"
    assert rank_trace_path("some.dir/run", 0) == "some.dir/run.rank0.json"


def test_run_options_round_trip_through_the_worker_parser() -> None:
    opts = run_options(steps=3, backward=False, input_shapes=["4x8", "2"], dtype="float64", device="cpu")
    parsed = ranks._worker_parser().parse_args(["x.py:make", "--run-dir", "d", "--out", "o.json", *opts])
    assert (parsed.steps, parsed.no_backward, parsed.input) == (3, True, ["4x8", "2"])
    assert (parsed.dtype, parsed.device) == ("float64", "cpu")
    assert run_options() == ["--steps", "1"]


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


def test_a_rank_that_died_is_named_with_its_exit_code() -> None:
    output = textwrap.dedent(
        """\
        Root Cause (first observed failure):
        [0]:
          time      : 2026-12-02_13:28:45
          host      : localhost
          rank      : 1 (local_rank: 1)
          exitcode  : -11 (pid: 15099)
        """
    )
    codes = ranks._launcher_exitcodes(output)
    assert codes == {1: -11}
    outcome = ranks._collect(
        1, {"rank": 1, "pid": 5, "state": "running"}, "/nonexistent.json", False, codes, ""
    )
    assert outcome.state == DIED and outcome.trace is None
    assert outcome.error == "the rank's process died from SIGSEGV"
    hung = ranks._collect(0, {"rank": 0, "pid": 5, "state": "running"}, "/nonexistent.json", True, {}, "")
    assert hung.state == HUNG


def test_summary_and_exit_code_of_agreeing_ranks() -> None:
    hooks = [_hook(1, "pre", kind="forward_pre")]
    traces = {r: _trace(hooks, [1], r) for r in (0, 1)}
    outcomes = [RankOutcome(r, OK, trace_path=f"t.rank{r}.json", trace=traces[r]) for r in (0, 1)]
    result = RanksResult(nproc=2, show_rank=1, ranks=outcomes, comparisons=compare_ranks(traces))
    assert result.exit_code == 0 and result.shown is traces[1]
    assert "ranks agree: same hook order on ranks 0, 1 (1 hook events each)" in result.summary()
    for o in outcomes:
        o.notes = ["backward skipped (--no-backward)"]
    outcomes[1].notes.append("only here")
    summary = result.summary()
    assert "note (every rank): backward skipped (--no-backward)" in summary
    assert "note (rank 1): only here" in summary
    outcomes[1].state, outcomes[1].error = FAILED, "boom"
    assert result.exit_code == 1 and "ranks failed: rank 1 failed" in result.summary()


def test_the_rank_that_caused_a_failure_is_named_not_the_ones_that_waited_for_it() -> None:
    waited = "forward hook sync raised RuntimeError: [gloo] Timed out waiting 4000ms for recv operation"
    closed = "grad hook f raised RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    own = "forward_pre hook boom raised RuntimeError: boom on rank 1"
    stopped = "forward_pre hook stall raised RankTerminated: stopped by SIGTERM"

    def result(*outcomes: RankOutcome) -> RanksResult:
        return RanksResult(nproc=len(outcomes), show_rank=0, ranks=list(outcomes), comparisons=[])

    # rank 1 raised first; rank 0 then lost its peer mid-collective (it reported later, but so what)
    r = result(
        RankOutcome(0, FAILED, error=closed, finished_at=1.0), RankOutcome(1, FAILED, own, finished_at=2.0)
    )
    assert r.first_failure is r.ranks[1]
    assert "first to fail: rank 1 (failed): forward_pre hook boom" in r.summary()
    # rank 0 timed out in a collective that rank 1, stuck in a hook, never reached
    r = result(
        RankOutcome(0, FAILED, error=waited, finished_at=1.0),
        RankOutcome(1, STOPPED, stopped, finished_at=2.0),
    )
    assert r.first_failure is r.ranks[1]
    assert "rank 1 held the others up: they timed out waiting for it" in r.summary()
    # two ranks failing on their own: the earlier one
    r = result(
        RankOutcome(0, FAILED, error=own, finished_at=3.0), RankOutcome(1, FAILED, own, finished_at=2.0)
    )
    assert r.first_failure is r.ranks[1]


def test_bad_arguments_are_usage_errors_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--rank 2"):
        run_ranks("x.py", 2, out=None, worker_args=[], timeout=10, show_rank=2)
    with pytest.raises(UsageError, match="--nproc 0"):
        run_ranks("x.py", 0, out=None, worker_args=[], timeout=10, show_rank=0)
    with pytest.raises(UsageError, match="--timeout"):
        run_ranks("x.py", 2, out=None, worker_args=[], timeout=0, show_rank=0)
    model = tmp_path / "model.py"
    model.write_text("def make():\n    pass\n")
    with pytest.raises(UsageError, match="does not exist"):
        run_ranks(
            str(model), 2, out=str(tmp_path / "no" / "run.json"), worker_args=[], timeout=10, show_rank=0
        )
    with pytest.raises(UsageError, match="file not found: .*missing.py"):
        run_ranks(str(tmp_path / "missing.py"), 2, out=None, worker_args=[], timeout=10, show_rank=0)


def test_usage_error_on_every_rank_is_exit_2_with_its_message() -> None:
    outcomes = [
        RankOutcome(0, USAGE, error="x.py has no attribute 'nope'"),
        RankOutcome(1, STOPPED, error="stopped by SIGTERM: the launcher stops every rank when one fails"),
    ]
    result = RanksResult(nproc=2, show_rank=0, ranks=outcomes, comparisons=[])
    assert result.usage_error == "x.py has no attribute 'nope'" and result.exit_code == 2
    outcomes[1].state = OK  # one rank ran: not a usage error of the whole run
    assert result.usage_error is None and result.exit_code == 1


# -- real ranks: 2 processes over gloo on CPU ---------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RanksResult, Path]:
    out = tmp_path_factory.mktemp("fsdp") / "fsdp.json"
    result = run_ranks(
        f"{SAMPLES / 'fsdp_two_ranks.py'}:make",
        2,
        out=str(out),
        worker_args=run_options(steps=2),
        timeout=60,
        show_rank=1,
    )
    return result, out


def test_fsdp_ranks_agree_and_write_one_trace_each(fsdp_run: tuple[RanksResult, Path]) -> None:
    result, out = fsdp_run
    assert [o.state for o in result.ranks] == [OK, OK], result.summary() + result.launcher_output[-2000:]
    assert result.exit_code == 0 and not result.diverged
    assert not out.exists()  # -o run.json names the rank files; there is no combined file
    for rank in (0, 1):
        path = out.with_name(f"fsdp.rank{rank}.json")
        assert result.ranks[rank].trace_path == str(path)
        data = json.loads(path.read_text())
        assert data["meta"]["rank"] == rank and data["meta"]["world_size"] == 2
        assert data["meta"]["steps"] == 2 and data["meta"]["target"].endswith("fsdp_two_ranks.py:make")
        assert {e["step"] for e in data["events"]} == {0, 1}
    assert result.shown is result.ranks[1].trace
    assert "ranks agree" in result.summary()


def test_fsdp_pre_forward_is_flagged_prepend_on_every_rank(fsdp_run: tuple[RanksResult, Path]) -> None:
    result, out = fsdp_run
    for rank in (0, 1):
        trace = load(out.with_name(f"fsdp.rank{rank}.json"))
        pre = [h for h in trace.hooks if h.name == "FSDPState._pre_forward"]
        assert {h.module for h in pre} == {"", "blocks.0", "blocks.1"}
        assert all(h.prepend and h.prepend_source == "registration" for h in pre)
        assert all(h.registered_at and h.registered_at.startswith("torch/distributed/fsdp/") for h in pre)
        # On each block FSDP's pre-forward fires before checkpoint's, although registered after it.
        block_pre = [
            trace.hook(e.hook).name
            for e in trace.hook_events()
            if e.module == "blocks.0" and e.kind == "forward_pre" and e.phase == "forward" and e.step == 0
        ]
        assert block_pre == ["FSDPState._pre_forward", "checkpoint.<locals>.forward_pre_hook"]
        assert any(e.phase == "recompute" for e in trace.events)


def test_a_hook_on_rank_1_only_diverges_and_names_hook_and_rank(tmp_path: Path) -> None:
    result = run_ranks(
        f"{SAMPLES / 'rank_divergence.py'}:make",
        2,
        out=str(tmp_path / "div.json"),
        worker_args=run_options(),
        timeout=60,
        show_rank=0,
    )
    assert [o.state for o in result.ranks] == [OK, OK], result.summary() + result.launcher_output[-2000:]
    assert result.diverged and result.exit_code == 1
    (c,) = result.comparisons
    d = c.divergence
    assert d is not None
    assert (d.rank, d.step, d.phase, d.module, d.kind) == (1, 0, "forward", "blocks.1", "forward")
    assert d.got is not None and d.got.startswith("log_activation")
    assert d.expected is not None and d.expected.startswith("FSDPState._post_forward")
    summary = result.summary()
    assert "ranks diverge: rank 1 differs from rank 0" in summary
    assert "only on rank 1: log_activation" in summary
    assert (tmp_path / "div.rank0.json").exists() and (tmp_path / "div.rank1.json").exists()


CRASHING = """
import torch
import torch.distributed as dist
from torch import nn


def boom(module, args):
    raise RuntimeError("boom on rank 1")


def sync(module, args, output):
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here for rank 1, which never comes
    return output


def make():
    dist.init_process_group("gloo")  # unconditionally: hooktrace has done it already, this must not fail
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].register_forward_hook(sync)
    if dist.get_rank() == 1:
        model[0].register_forward_pre_hook(boom)
    return model, torch.randn(2, 4)
"""


def test_a_crashing_rank_stops_the_others_and_is_reported(tmp_path: Path) -> None:
    factory = tmp_path / "crashing.py"
    factory.write_text(CRASHING)
    start = time.monotonic()
    result = run_ranks(str(factory), 2, out=str(tmp_path / "c.json"), worker_args=[], timeout=30, show_rank=0)
    elapsed = time.monotonic() - start
    assert result.exit_code == 1
    one = result.ranks[1]
    assert one.state == FAILED, result.summary() + result.launcher_output[-2000:]
    assert one.error is not None and "boom" in one.error and "RuntimeError: boom on rank 1" in one.error
    assert one.trace is not None and (tmp_path / "c.rank1.json").exists()  # the partial trace
    assert [h.name for h in one.trace.hooks if h.name == "boom"] == ["boom"]
    zero = result.ranks[0]
    assert zero.state != OK and zero.trace is not None  # stopped in its all_reduce, partial trace kept
    assert result.first_failure is one
    summary = result.summary()
    assert (
        "first to fail: rank 1 (failed): forward_pre hook boom raised RuntimeError: boom on rank 1" in summary
    )
    assert elapsed < 90


HANGING = """
import time

import torch
import torch.distributed as dist
from torch import nn


def stall(module, args):
    time.sleep(600)


def make():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    if dist.get_rank() == 1:
        model[1].register_forward_pre_hook(stall)
    return model, torch.randn(2, 4)
"""


def test_a_hanging_rank_is_stopped_after_the_timeout_with_its_partial_trace(tmp_path: Path) -> None:
    factory = tmp_path / "hanging.py"
    factory.write_text(HANGING)
    start = time.monotonic()
    result = run_ranks(str(factory), 2, out=None, worker_args=[], timeout=3, show_rank=0)
    elapsed = time.monotonic() - start
    assert elapsed < 120  # not the 600 s the hook sleeps
    assert result.timed_out and result.exit_code == 1
    assert result.ranks[0].state == OK
    hung = result.ranks[1]
    assert hung.state == HUNG, result.summary() + result.launcher_output[-2000:]
    assert hung.error is not None and "stall" in hung.error and "--timeout" in hung.error
    assert hung.trace is not None  # partial: the stall hook fired, nothing after it
    fired = [hung.trace.hook(e.hook).name for e in hung.trace.hook_events()]
    assert fired == ["stall"]
    assert result.trace_dir is not None and Path(result.trace_dir, "trace.rank1.json").exists()
    shutil.rmtree(result.trace_dir)  # without -o the traces go to a folder that is kept for the user
    assert "stopped every rank: one still ran 3s after another had stopped" in result.summary()


def test_a_factory_name_that_does_not_exist_is_a_usage_error_from_the_ranks(tmp_path: Path) -> None:
    factory = tmp_path / "model.py"
    factory.write_text("def make():\n    raise AssertionError('never called')\n")
    result = run_ranks(
        f"{factory}:nope", 2, out=str(tmp_path / "u.json"), worker_args=[], timeout=30, show_rank=0
    )
    assert result.exit_code == 2, result.summary() + result.launcher_output[-2000:]
    assert result.usage_error is not None and "has no attribute 'nope'" in result.usage_error
    assert not (tmp_path / "u.rank0.json").exists()
