"""Signals to `hooktrace exec --nproc 2` and to torchrun running `hooktrace exec` (issue 33): the
ranks are stopped (no process of the run is left), each writes its partial trace, and a rank file
an earlier run left at the same path is never read as this run's.

Real launches: two ranks on CPU over gloo, the script joining the group itself as under torchrun;
each takes 15-30 s on a loaded 2-core machine, so all are marked slow. Processes are followed with
psutil from the launcher down (the ranks run in sessions of their own: a signal reaches them only
through the launcher).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hooktrace

from .rank_factories import default_stop_signals

psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

TRAIN = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(2, 1)
def rank_hook(m, i, o):
    pass
model.register_forward_hook(rank_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(200):
    model(torch.ones(2)).sum().backward()
    opt.step()
    if step == 1:
        open(f"ready{rank}", "w").close()  # inside the window (steps 0-99)
    if step == 2 and rank == 1 and os.environ.get("KILL_RANK1"):
        os.kill(os.getpid(), 9)  # dies without a word: no trace written
    time.sleep(0.1)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _earlier_run(tmp_path: Path) -> dict[int, tuple[int, int]]:
    """Rank files an earlier run left (valid traces of another hook): their identities."""
    import torch

    for r in (0, 1):
        model = torch.nn.Linear(2, 1)
        model.register_forward_hook(lambda m, i, o: None)
        with hooktrace.trace(model) as t:
            model(torch.ones(2))
        t.set_meta(rank=r, world_size=2)
        t.save(str(tmp_path / f"run.rank{r}.json"))
    return {r: _identity(tmp_path / f"run.rank{r}.json") for r in (0, 1)}


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _start(tmp_path: Path, command: list[str], **env: str) -> tuple[subprocess.Popen, dict[int, object]]:
    """Start `command` in tmp_path; wait until both ranks are inside the window; the processes under it."""
    (tmp_path / "train.py").write_text(TRAIN)
    proc = subprocess.Popen(
        command, cwd=tmp_path, env={**_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=default_stop_signals,
    )  # fmt: skip
    seen: dict[int, object] = {}
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        for child in psutil.Process(proc.pid).children(recursive=True):
            seen[child.pid] = child
        time.sleep(0.1)
    for child in psutil.Process(proc.pid).children(recursive=True):
        seen[child.pid] = child
    return proc, seen


def _left(processes: dict[int, object], within: float = 30.0) -> list[int]:
    """The processes of the run still running after `within` seconds (a zombie is not running)."""
    deadline = time.monotonic() + within
    while True:
        left = [
            pid for pid, p in processes.items()
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE  # type: ignore[attr-defined]
        ]  # fmt: skip
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _hooks(path: Path) -> list[str]:
    trace = hooktrace.load(path)
    return [trace.hook(e.hook).name for e in trace.hook_events()]


EXEC = [
    sys.executable,
    "-m",
    "hooktrace",
    "exec",
    "--nproc",
    "2",
    "--steps",
    "100",
    "-o",
    "run.json",
    "train.py",
]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_signal_to_exec_nproc_stops_every_rank_with_its_partial_trace(tmp_path, sig):
    before = _earlier_run(tmp_path)
    proc, processes = _start(tmp_path, EXEC)
    assert len(processes) >= 2, processes  # the two ranks
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, out + err
    assert _left(processes) == []
    for r in (0, 1):
        path = tmp_path / f"run.rank{r}.json"
        assert _identity(path) != before[r]  # this run's file, written when the rank was stopped
        assert hooktrace.load(path).meta.rank == r
        names = _hooks(path)
        assert names and set(names) == {"rank_hook"} and len(names) < 100, names  # partial
        assert f"rank {r}: stopped" in out and f"stopped by {sig.name}" in out, out
    assert f"interrupted by {sig.name}: stopped every rank" in out, out


def test_a_rank_that_wrote_nothing_is_not_read_from_an_earlier_run_s_file(tmp_path):
    """Rank 1 dies by SIGKILL inside the window: its earlier file stays as it was and is not read
    (it showed as `ok`); rank 0 is stopped with its partial trace."""
    before = _earlier_run(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    done = subprocess.run(
        EXEC, cwd=tmp_path, env={**_env(), "KILL_RANK1": "1"}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 1: died (no trace written)" in done.stdout, done.stdout
    assert "died from SIGKILL" in done.stdout, done.stdout
    assert _identity(tmp_path / "run.rank1.json") == before[1]  # left as it was, and not read
    assert _identity(tmp_path / "run.rank0.json") != before[0]
    assert set(_hooks(tmp_path / "run.rank0.json")) == {"rank_hook"}


def test_the_ranks_end_when_the_launcher_is_killed(tmp_path):
    """SIGKILL to hooktrace (no handler can run): each rank is told by the kernel (SIGTERM on its
    parent's death), writes its partial trace and ends; none is left running alone (they ran on
    untraced to the end of their window, then wrote full traces)."""
    before = _earlier_run(tmp_path)
    proc, processes = _start(tmp_path, EXEC)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert _left(processes, within=20) == []
    for r in (0, 1):
        path = tmp_path / f"run.rank{r}.json"
        assert _identity(path) != before[r]
        assert 0 < len(_hooks(path)) < 100  # partial: stopped well before step 100


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_to_torchrun_stops_the_hooktrace_ranks_with_their_partial_traces(tmp_path, sig):
    """The real torchrun, one node, two ranks each running `hooktrace exec`: a stop signal to torchrun
    reaches every rank (torchrun passes it on); each writes its partial trace, none is left."""
    before = _earlier_run(tmp_path)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command = [*torchrun, "-m", "hooktrace", "exec", "--steps", "100", "-o", "run.json", "train.py"]
    proc, processes = _start(tmp_path, command)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert _left(processes) == []
    for r in (0, 1):
        path = tmp_path / f"run.rank{r}.json"
        assert _identity(path) != before[r]
        names = _hooks(path)
        assert names and set(names) == {"rank_hook"} and len(names) < 100, names
    assert f"stopped by {sig.name}: the trace above is partial" in err, err
