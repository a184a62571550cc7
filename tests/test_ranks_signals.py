"""`run --nproc` when a rank is killed by a signal (the OOM killer's SIGKILL, someone's SIGTERM, a
segfault...) and when the launcher itself gets one: the launcher survives, says which rank died of
what, keeps the healthy ranks' traces, and exits 1 (or 128 + the launcher's own signal).

Each case is one real launch over gloo on CPU (every rank imports torch): the family's most common
members run by default, the rest with `-m slow`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from hooktrace.ranks import DIED, OK, run_ranks
from hooktrace.validate import load

from .rank_factories import HOOKTRACE, one_hook_factory

KILLED = """
import os
import signal

import torch
import torch.distributed as dist
from torch import nn


def die(module, args):
    dist.barrier()  # both ranks are tracing when rank 1 dies
    if dist.get_rank() == 1:
        os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIGNAL"]))


def sync(module, args, output):
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here for rank 1
    return output


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[0].register_forward_pre_hook(die)
    model[1].register_forward_hook(sync)
    return model, torch.randn(2, 4)
"""

# Python's handler stays on these: the rank writes its partial trace before it ends.
_KEEPS_TRACE = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_SLOW = pytest.mark.slow


def _hook_names(trace: object) -> list[str]:
    return [trace.hook(e.hook).name for e in trace.hook_events()]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGKILL,
        signal.SIGTERM,
        pytest.param(signal.SIGINT, marks=_SLOW),
        pytest.param(signal.SIGHUP, marks=_SLOW),
        pytest.param(signal.SIGSEGV, marks=_SLOW),
        pytest.param(signal.SIGQUIT, marks=_SLOW),
        pytest.param(signal.SIGABRT, marks=_SLOW),
        pytest.param(signal.SIGUSR1, marks=_SLOW),
        pytest.param(signal.SIGALRM, marks=_SLOW),
    ],
    ids=lambda s: s.name,
)
def test_a_rank_killed_by_a_signal_is_reported_and_the_launcher_keeps_the_others_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    factory = tmp_path / "killed.py"
    factory.write_text(KILLED)
    monkeypatch.setenv("KILL_SIGNAL", sig.name)
    out = tmp_path / "k.json"
    result = run_ranks(str(factory), 2, out=str(out), timeout=60, show_rank=0)
    summary = result.summary()
    dead = result.ranks[1]
    assert dead.state == DIED, summary
    assert dead.error is not None and sig.name in dead.error
    if sig in _KEEPS_TRACE:  # its handler ran: the partial trace, and where it was
        assert dead.exitcode == 4 and "forward_pre hook die" in dead.error
        assert "(a signal hooktrace did not send)" in dead.error
        assert dead.trace is not None and _hook_names(dead.trace) == ["die"]
    else:
        assert dead.exitcode == -sig and dead.error.startswith(f"the rank's process died from {sig.name}")
        assert dead.trace is None and not (tmp_path / "k.rank1.json").exists()
    healthy = result.ranks[0]  # waited in its all_reduce for rank 1: stopped or failed, never blamed
    assert healthy.state != OK and healthy.trace is not None, summary
    assert _hook_names(healthy.trace)[:1] == ["die"]
    assert load(tmp_path / "k.rank0.json").meta.rank == 0
    assert result.first_failure is dead
    assert result.exit_code == 1 and result.interrupted is None
    assert "ranks failed:" in summary and "rank 1: died" in summary


def test_the_cli_says_which_rank_died_of_sigkill_without_a_traceback(tmp_path: Path) -> None:
    factory = tmp_path / "killed.py"
    factory.write_text(KILLED)
    env = dict(os.environ, KILL_SIGNAL="SIGKILL")
    proc = subprocess.run(
        [str(HOOKTRACE), "run", str(factory), "--nproc", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr
    assert "rank 1: died (no trace written)\n    the rank's process died from SIGKILL" in proc.stdout
    assert "first to fail: rank 1 (died): the rank's process died from SIGKILL" in proc.stdout


HANG_UP = """
def hang_up(module, args):
    os.kill(os.getppid(), signal.SIGHUP)  # the launcher's terminal closes while rank 0 traces
"""


def test_a_launcher_started_under_nohup_ignores_sighup_and_so_do_its_ranks(tmp_path: Path) -> None:
    factory = one_hook_factory(tmp_path / "hangup.py", HANG_UP, "register_forward_pre_hook")
    proc = subprocess.run(
        [str(HOOKTRACE), "run", str(factory), "--nproc", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # what nohup does
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: ok, 1 hook registered, 1 fired, 1 hook call" in proc.stdout
    assert "interrupted" not in proc.stdout


class _SignalledStore:
    """A launcher store whose read is where the launcher's stop-signal handler happens to raise."""

    def __init__(self, raising: BaseException) -> None:
        self.raising = raising

    def check(self, keys: list[str]) -> bool:
        raise self.raising


@pytest.mark.parametrize("torchs", [False, True], ids=["ours", "torch_signal_exception"])
def test_a_stop_signal_that_lands_in_a_store_read_still_stops_the_launch(torchs: bool) -> None:
    # The launcher polls the ranks' progress in the store ten times a second; a SIGHUP/SIGTERM whose
    # handler raised inside that read was swallowed as "the store cannot say", and the ranks ran on.
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from hooktrace.ranks.launch import _Watch
    from hooktrace.runs.stop import Stopped

    raised = SignalException("got SIGHUP", signal.SIGHUP) if torchs else Stopped(signal.SIGHUP)
    watch = _Watch(nproc=1, timeout=1, join_timeout=1)
    watch.store = _SignalledStore(raised)
    with pytest.raises(type(raised)):
        watch._read("progress/0")


def test_a_store_that_cannot_answer_is_no_report() -> None:
    from hooktrace.ranks.launch import _Watch

    watch = _Watch(nproc=1, timeout=1, join_timeout=1)
    watch.store = _SignalledStore(RuntimeError("connection reset by peer"))
    assert watch._read("progress/0") is None


class _NoStore:
    def set(self, key: str, value: str) -> None:
        pass


def test_a_stop_signal_once_the_run_has_ended_waits_until_the_trace_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The launcher stops the other ranks when one fails; a rank whose run had just ended (its
    # collective failed because the peer died) got the SIGTERM while building or writing its trace,
    # and the stop escaped from there: no trace at all. Deterministic here: the signal is
    # sent the moment the run ends.
    from hooktrace.ranks import worker

    samples = Path(__file__).resolve().parent.parent / "samples"
    job = {"target": str(samples / "quickstart.py"), "options": {}, "out": str(tmp_path / "q.json")}
    armed = worker._DEFERRAL.armed
    seen: list[bool] = []

    def armed_then_signalled(running: bool) -> None:
        armed(running)
        seen.append(running)
        if not running:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this thread

    monkeypatch.setattr(worker._DEFERRAL, "armed", armed_then_signalled)
    monkeypatch.setattr(worker._DEFERRAL, "pending", None)
    previous = signal.signal(signal.SIGTERM, worker._raise_terminated)
    try:
        worker._traced(job, 0, 1, worker._Store(_NoStore(), 0), None)  # ends as its run did: no raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        worker._DEFERRAL.deferring = False
    assert seen == [True, False] and worker._DEFERRAL.pending == signal.SIGTERM
    trace = load(tmp_path / "q.rank0.json")
    assert trace.meta.rank == 0 and len(list(trace.hook_events())) == 10  # the whole run's trace


def test_a_stop_signal_while_the_steps_run_still_stops_the_rank_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hooktrace.ranks import worker

    monkeypatch.setattr(worker._DEFERRAL, "pending", None)
    worker._DEFERRAL.armed(True)
    handlers = {sig: signal.getsignal(sig) for sig in worker.STOP_SIGNALS}
    try:
        with pytest.raises(worker.Stopped, match="stopped by SIGTERM"):
            worker._raise_terminated(signal.SIGTERM, None)
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in handlers)  # one is enough
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert worker._DEFERRAL.pending is None


@pytest.mark.parametrize(
    ("said", "signalled", "state"),
    [
        ("stopped by SIGINT while in forward_pre hook die", None, "died"),  # its own signal, not ours
        ("stopped by SIGTERM while in forward_pre hook die", None, "stopped"),  # the one hooktrace sent
        # the same signal by name: the rank's SIGTERM came before hooktrace sent its own (seen on torch
        # 2.8, whose gloo fails rank 0 sooner), so it is someone else's; after it, hooktrace's
        ("stopped by SIGTERM while in forward_pre hook die", -1.0, "died"),
        ("stopped by SIGTERM while in forward_pre hook die", 1.0, "stopped"),
    ],
)
def test_a_rank_still_ending_on_its_own_signal_when_the_others_are_stopped_is_not_called_stopped(
    said: str, signalled: Optional[float], state: str
) -> None:
    # Rank 1 gets a SIGINT nobody in hooktrace sent; ending, it closes its process group, so rank 0's
    # collective fails and the launcher stops the ranks still running (SIGTERM), rank 1 among them if
    # it has not exited yet (CI, under load): the signal it names, or when it came, says whose stop it was.
    from hooktrace.ranks.launch import _Watch
    from hooktrace.ranks.result import STOPPED, RankOutcome
    from hooktrace.ranks.worker import SIGNALLED_KEY

    watch = _Watch(nproc=2, timeout=1, join_timeout=1)
    watch.stopped, watch.stop_signal, watch.stop_sent_at = {1}, signal.SIGTERM, 1000.0
    reported = {SIGNALLED_KEY.format(rank=1): repr(1000.0 + signalled)} if signalled is not None else {}
    watch._read = reported.get  # type: ignore[method-assign]  # the rank's report in the store
    outcome = RankOutcome(rank=1, state=STOPPED, error=said)
    watch._stopped_from_outside(outcome)
    assert outcome.state == state
    assert ("(a signal hooktrace did not send)" in (outcome.error or "")) == (state == DIED)
