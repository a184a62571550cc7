"""How a traced program is stopped (docs/contract.md, exit codes): the window closing in a training
thread, a dropped terminal's SIGHUP, Ctrl-C while the factory loads. Real processes, as users run them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import hooktrace

from .rank_factories import default_stop_signals

THREADED = """
import threading
import torch

order = []


def train():
    model = torch.nn.Linear(2, 2)
    model.register_forward_hook(lambda m, a, o: order.append("forward"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
    print("trainer done", len(order), flush=True)


worker = threading.Thread(target=train, name="trainer")
worker.start()
worker.join()
print("main done", flush=True)
"""


def _hooktrace(*args: str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess:
    kwargs.setdefault("preexec_fn", default_stop_signals)  # as from a terminal, under nohup or `&` too
    return subprocess.run(
        [sys.executable, "-m", "hooktrace", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip


def test_the_window_closing_in_a_training_thread_raises_nothing_there(tmp_path: Path) -> None:
    # hooktrace stopped the script by raising inside the thread that ran optimizer.step(): that thread
    # printed hooktrace's own traceback and died, the main thread went on. Now nothing is raised in a
    # thread of the script: the trace is written when the window closes, the script runs on untraced.
    (tmp_path / "threaded.py").write_text(THREADED)
    done = _hooktrace("exec", "--steps", "1", "-o", "t.json", "threaded.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Stopped" not in done.stderr, done.stderr
    assert "trainer done 4" in done.stdout and "main done" in done.stdout  # the thread ended as untraced
    assert "window closed in thread 'trainer'" in done.stderr and "ran on untraced" in done.stderr
    trace = hooktrace.load(tmp_path / "t.json")
    assert [trace.hook(e.hook).kind for e in trace.hook_events()] == ["forward"]  # step 0 only


def test_the_window_closing_in_the_main_thread_still_stops_the_script(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(THREADED.replace("worker.start()\nworker.join()", "train()"))
    done = _hooktrace("exec", "--steps", "1", "-o", "t.json", "plain.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "trainer done" not in done.stdout and "main done" not in done.stdout
    assert "stopped the script there" in done.stderr


SIGNALLED_FACTORY = """
import os
import signal

import torch

calls = []


def maybe_stop(module, args, output):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGHUP)


def make():
    model = torch.nn.Linear(2, 1)
    model.register_forward_hook(maybe_stop)
    return model, torch.randn(1, 2)
"""


def test_sighup_stops_run_with_the_partial_trace(tmp_path: Path) -> None:
    # SIGHUP (the terminal closed, an ssh session dropped) ended `run` with no trace, where SIGINT and
    # SIGTERM keep the partial one.
    (tmp_path / "hup.py").write_text(SIGNALLED_FACTORY)
    done = _hooktrace("run", "hup.py", "--steps", "5", "-o", "t.json", cwd=tmp_path)
    assert done.returncode == 128 + signal.SIGHUP, done.stderr
    assert "stopped by SIGHUP: the trace above is partial" in done.stderr
    trace = hooktrace.load(tmp_path / "t.json")
    assert {e.step for e in trace.hook_events()} == {0, 1, 2}


def test_sighup_stops_exec_with_the_partial_trace(tmp_path: Path) -> None:
    scripts = Path(__file__).parent / "scripts"
    out = tmp_path / "t.json"
    done = _hooktrace("exec", "--steps", "5", "-o", str(out), "signals.py", "SIGHUP", cwd=scripts)
    assert done.returncode == 128 + signal.SIGHUP, done.stderr
    assert "not stopped" not in done.stdout
    assert "stopped by SIGHUP: the trace above is partial" in done.stderr
    assert {e.step for e in hooktrace.load(out).events} == {0, 1, 2}


def test_sighup_under_nohup_stays_ignored(tmp_path: Path) -> None:
    # the nearest case where the rule must not fire: a signal the run was started ignoring stays so
    (tmp_path / "hup.py").write_text(SIGNALLED_FACTORY)
    ignore = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731
    done = _hooktrace("run", "hup.py", "--steps", "5", "-o", "t.json", cwd=tmp_path, preexec_fn=ignore)
    assert done.returncode == 0, done.stderr
    assert {e.step for e in hooktrace.load(tmp_path / "t.json").hook_events()} == {0, 1, 2, 3, 4}


LOADS_SLOWLY = """
import os
import signal

import torch


def make():
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the factory builds the model
    return torch.nn.Linear(2, 1), torch.randn(1, 2)
"""


def test_ctrl_c_while_the_factory_loads_keeps_an_earlier_trace(tmp_path: Path) -> None:
    # The earlier trace at -o was replaced by an empty one: nothing had run yet.
    (tmp_path / "quick.py").write_text(SIGNALLED_FACTORY)
    made = _hooktrace("run", "quick.py", "--steps", "2", "-o", "t.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    before = (tmp_path / "t.json").read_bytes()
    (tmp_path / "slow.py").write_text(LOADS_SLOWLY)
    done = _hooktrace("run", "slow.py", "-o", "t.json", cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    assert "stopped by SIGINT while loading the target: nothing was traced" in done.stderr
    assert "t.json is left as it was" in done.stderr
    assert (tmp_path / "t.json").read_bytes() == before


def test_ctrl_c_after_the_factory_loaded_writes_the_partial_trace(tmp_path: Path) -> None:
    # the nearest case: once the steps run, a stop keeps what was traced (and replaces the file)
    (tmp_path / "quick.py").write_text(SIGNALLED_FACTORY.replace("signal.SIGHUP", "signal.SIGINT"))
    (tmp_path / "t.json").write_text("{}")
    done = _hooktrace("run", "quick.py", "--steps", "5", "-o", "t.json", cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    assert {e.step for e in hooktrace.load(tmp_path / "t.json").hook_events()} == {0, 1, 2}


@pytest.mark.parametrize(
    "args",
    [
        ("--nproc", "99999999999"),
        ("--nproc", "99999999999", "-o", "x.json"),
        ("--steps", str(10**20)),
        ("--steps", "99999999999"),
        ("--start", str(10**20)),
    ],
    ids=["nproc", "nproc-o", "steps-huge", "steps", "start"],
)
def test_numbers_past_any_run_are_one_error_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "s.py").write_text("print('ran', flush=True)\n")
    done = _hooktrace("exec", *args, "s.py", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "ran" not in done.stdout and not (tmp_path / "x.rank0.json").exists()


@pytest.mark.parametrize(
    ("rank", "world"), [("0", "1000000000"), ("0", str(2**70)), ("5", "2"), ("-1", "2"), ("0", "0")]
)
def test_rank_and_world_size_no_launcher_sets_are_one_error_line(
    tmp_path: Path, rank: str, world: str
) -> None:
    # exec wrote a trace claiming world_size 10**9 (and `ranks` then filled the memory), or stopped with
    # an internal error past 64 bits.
    (tmp_path / "s.py").write_text("print('ran', flush=True)\n")
    env = dict(os.environ, RANK=rank, WORLD_SIZE=world)
    done = _hooktrace("exec", "-o", "t.json", "s.py", cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "ran" not in done.stdout and not list(tmp_path.glob("t*.json"))


def test_a_rank_a_launcher_sets_is_taken(tmp_path: Path) -> None:
    # the nearest case: a real rank and world size are written to the rank's file
    (tmp_path / "s.py").write_text("print('ran', flush=True)\n")
    env = dict(os.environ, RANK="1", WORLD_SIZE="2")
    done = _hooktrace("exec", "-o", "t.json", "s.py", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    trace = hooktrace.load(tmp_path / "t.rank1.json")
    assert (trace.meta.rank, trace.meta.world_size) == (1, 2)


KEEPS_RUNNING = """
import torch

model = torch.nn.Linear(2, 1)
model.register_forward_hook(lambda m, a, o: None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    print("script step", step, flush=True)
"""


@pytest.mark.slow
def test_under_torchrun_with_o_rank_0_prints_nothing_to_stdout(tmp_path: Path) -> None:
    # rank 0 printed the tree to stdout even with -o; with --keep-running, inside the script's output
    (tmp_path / "k.py").write_text(KEEPS_RUNNING)
    args = [
        "--standalone",
        "--nproc-per-node",
        "1",
        "-m",
        "hooktrace",
        "exec",
        "--keep-running",
        "-o",
        "t.json",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args, "k.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"script step {s}" for s in range(3)], done.stdout
    assert "t.rank0.json" in done.stderr
    assert len(list(hooktrace.load(tmp_path / "t.rank0.json").hook_events())) == 1
