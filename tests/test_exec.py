"""`hooktrace exec`: a user's script run as python runs it, traced inside a window of steps (docs/contract.md, Scripts).

Each script's hooks record themselves (tests/scripts/oracle_log.py): the traced order is compared
with that record, restricted to the window's steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import hooktrace
from hooktrace.cli import main

from .oracle import GLOBAL_DICT_ATTRS

SCRIPTS = Path(__file__).parent / "scripts"
_SCRIPT_MODULES = ("oracle_log", "pkg", "pkg.train", "pkg.model")


@pytest.fixture
def exec_in(tmp_path, monkeypatch, capsys):
    """Run `hooktrace exec ARGS` in this process from tests/scripts; (code, stdout, stderr, log path)."""
    log = tmp_path / "hooks.log"
    monkeypatch.setenv("HOOKTRACE_TEST_LOG", str(log))
    monkeypatch.chdir(SCRIPTS)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", ["hooktrace"])

    import torch.nn.modules.module as nn_module

    globals_before = {attr: dict(getattr(nn_module, attr)) for attr in GLOBAL_DICT_ATTRS}

    def clean() -> None:
        # a script stopped after the window leaves what it registered globally (its process would end)
        for attr, before in globals_before.items():
            d = getattr(nn_module, attr)
            for key in [k for k in d if k not in before]:
                del d[key]

    def run(*args: str) -> tuple[int, str, str, Path]:
        clean()
        if log.exists():
            log.unlink()
        for name in _SCRIPT_MODULES:
            sys.modules.pop(name, None)
        capsys.readouterr()
        code = main(["exec", *args])
        out, err = capsys.readouterr()
        return code, out, err, log

    yield run
    clean()


def _logged(log: Path, first: int, last: int) -> list[str]:
    if not log.exists():
        return []
    names = []
    for line in log.read_text().splitlines():
        step, name = line.split()
        if first <= int(step) <= last:
            names.append(name)
    return names


def _traced(trace: hooktrace.Trace) -> list[str]:
    by_id = {h.id: h.name for h in trace.hooks}
    return [by_id[e.hook] for e in trace.events if e.type == "hook"]


def test_a_plain_loop_with_accumulation_is_traced_in_its_window_and_stopped(exec_in, tmp_path):
    out_path = tmp_path / "loop.json"
    code, out, err, log = exec_in(
        "--start", "2", "--steps", "2", "-o", str(out_path), "loop.py", "--steps", "5"
    )
    assert code == 0, err
    trace = hooktrace.load(out_path)
    assert _traced(trace) == _logged(log, 2, 3)
    assert "finished" not in out  # stopped after the window
    assert "traced steps 2-3" in err and "stopped the script there" in err
    assert trace.meta.steps == 2 and {e.step for e in trace.events} == {0, 1}
    assert trace.meta.warmup == 2  # --start 2: renderings say the times come after 2 untraced steps
    # two backward calls per optimizer step: each step has two forward calls of the model
    model_calls = [e for e in trace.events if e.type == "enter" and e.module == "Net"]
    assert len(model_calls) == 4
    assert [m.path for m in trace.modules] == ["Net", "Net.fc1", "Net.act", "Net.fc2", "MSELoss"]
    hooks = {h.name: h for h in trace.hooks}
    assert hooks["first_pre"].prepend and hooks["first_pre"].prepend_source == "registration"
    assert hooks["first_pre"].registered_at.startswith("loop.py:")  # seen before the window opened
    assert hooks["weight_grad"].tensor == "Net.fc1.weight"
    assert hooks["after_step"].scope == "optimizer"
    assert hooks["global_pre"].scope == "global"


def test_keep_running_lets_the_script_finish(exec_in, tmp_path):
    out_path = tmp_path / "loop.json"
    code, out, err, log = exec_in(
        "--start", "1", "--keep-running", "-o", str(out_path), "loop.py", "--steps", "3", "--say", "hi"
    )
    assert code == 0, err
    assert "hi ['--steps', '3', '--say', 'hi'] __main__" in out  # its argv, its __name__, its stdout
    assert "finished 3" in out
    assert _traced(hooktrace.load(out_path)) == _logged(log, 1, 1)


def test_the_whole_script_when_it_ends_first(exec_in, tmp_path):
    out_path = tmp_path / "loop.json"
    code, out, err, log = exec_in("--steps", "50", "-o", str(out_path), "loop.py", "--steps", "2")
    assert code == 0
    assert "finished 2" in out
    assert "the script ended inside the window" in err
    assert _traced(hooktrace.load(out_path)) == _logged(log, 0, 99)


@pytest.mark.parametrize("raising", [False, True])
def test_a_script_over_before_the_window_opens_says_so(exec_in, tmp_path, raising):
    """`--start 5` on a script of 2 steps (or one that raises in its second): an empty trace, the
    note, the script's own exit code and every hook it ran as when untraced; nothing of hooktrace left
    installed (the empty trace's capture opened beside the registration watch and failed)."""
    import torch

    registers = {
        name: vars(torch.nn.Module)[name] for name in vars(torch.nn.Module) if name.startswith("register_")
    }
    script = ["raises.py"] if raising else ["loop.py", "--steps", "2"]
    out_path = tmp_path / "t.json"
    code, out, err, log = exec_in("--start", "5", "-o", str(out_path), *script)
    plain = _logged(log, 0, 99)
    assert code == (1 if raising else 0), err
    assert "before the window opened (--start 5): nothing traced" in err
    assert "another capture" not in err and (raising or "finished 2" in out)
    assert hooktrace.load(out_path).events == []
    assert {name: vars(torch.nn.Module)[name] for name in registers} == registers
    # the hooks ran as they do untraced: the same script under plain python logs the same
    untraced = tmp_path / "untraced.log"
    env = {**os.environ, "HOOKTRACE_TEST_LOG": str(untraced)}
    done = subprocess.run([sys.executable, *script], cwd=SCRIPTS, env=env, capture_output=True, text=True)
    assert done.returncode == code
    assert plain == _logged(untraced, 0, 99) and (plain or raising)  # raises.py logs nothing


def test_step_on_backward(exec_in, tmp_path):
    out_path = tmp_path / "loop.json"
    # accumulation 2: two backward calls per optimizer step; backward 2 ends the first half of step 1
    code, _out, err, log = exec_in(
        "--step-on", "backward", "--start", "2", "-o", str(out_path), "loop.py", "--steps", "3"
    )
    assert code == 0, err
    step0, step1 = _logged(log, 0, 0), _logged(log, 1, 1)
    # the window: optimizer step 0's update (after backward 2), then step 1's first forward and backward
    assert step0[-1] == "after_step"
    assert _traced(hooktrace.load(out_path)) == ["after_step", *step1[: step1.index("weight_grad") + 1]]


def test_step_on_forward(exec_in, tmp_path):
    out_path = tmp_path / "loop.json"
    code, _out, err, log = exec_in("--step-on", "forward", "-o", str(out_path), "loop.py", "--steps", "3")
    assert code == 0, err
    trace = hooktrace.load(out_path)  # the first outermost call: the model's
    assert [e.module for e in trace.events if e.type == "enter"] == ["", "fc1", "act", "fc2"]
    assert _traced(trace) == _logged(log, 0, 0)[:6]
    assert _traced(trace) == ["global_pre", "global_pre", "first_pre", "fc1_out", "global_pre", "global_pre"]
    # inference: each model call is a step
    code, _out, err, log = exec_in("--step-on", "forward", "--start", "1", "-o", str(out_path), "nostep.py")
    assert code == 0, err
    assert _traced(hooktrace.load(out_path)) == _logged(log, 1, 1) == ["seen"]
    assert "never called" not in err


def test_sys_exit_code_is_the_script_s(exec_in, tmp_path):
    code, _out, err, _log = exec_in("--steps", "5", "-o", str(tmp_path / "t.json"), "exits.py")
    assert code == 3
    assert "exited with code 3" in err
    trace = hooktrace.load(tmp_path / "t.json")
    assert len([e for e in trace.events if e.type == "hook"]) == 2


def test_a_raising_script_exits_1_with_the_partial_trace(exec_in, tmp_path):
    code, _out, err, _log = exec_in("--steps", "3", "-o", str(tmp_path / "t.json"), "raises.py")
    assert code == 1
    assert "ValueError: output out of range" in err
    assert 'raises.py", line' in err  # the script's traceback, as python prints it
    assert "run failed: forward hook check_output raised ValueError: output out of range" in err
    trace = hooktrace.load(tmp_path / "t.json")
    errors = [e for e in trace.events if e.type == "hook" and e.error]
    assert [e.step for e in errors] == [1]


def test_a_script_that_never_steps_says_to_use_step_on(exec_in, tmp_path):
    code, _out, err, log = exec_in("-o", str(tmp_path / "t.json"), "nostep.py")
    assert code == 0
    assert "never called optimizer.step()" in err and "--step-on" in err
    assert _traced(hooktrace.load(tmp_path / "t.json")) == _logged(log, 0, 9) == ["seen"] * 3


def test_dash_m_runs_a_package_module(exec_in, tmp_path):
    code, out, err, log = exec_in(
        "--start", "1", "--keep-running", "-o", str(tmp_path / "t.json"), "-m", "pkg.train", "4"
    )
    assert code == 0, err
    assert "module __main__ pkg" in out
    trace = hooktrace.load(tmp_path / "t.json")
    assert [n.split(".")[-1] for n in _traced(trace)] == _logged(log, 1, 1) == ["tanh_out"]
    assert trace.meta.target == "-m pkg.train"


def test_options_after_the_script_are_the_script_s(exec_in, tmp_path):
    code, out, err, _log = exec_in("--start", "0", "loop.py", "--steps", "1", "--say=--steps")
    assert code == 0, err
    assert "--steps ['--steps', '1', '--say=--steps']" in out


def test_bad_usage_is_one_error_line(exec_in):
    code, _out, err, _log = exec_in("missing.py")
    assert code == 2 and err.startswith("error: script not found: missing.py")
    code, _out, err, _log = exec_in("--step-on", "epoch", "loop.py")
    assert code == 2 and "unknown --step-on 'epoch'" in err
    code, _out, err, _log = exec_in("-m", "no_such_module_here")
    assert code == 2 and "no module named 'no_such_module_here'" in err


def test_untraced_steps_leave_no_wrapper(exec_in, tmp_path):
    """Before the window nothing is installed per call; after it, nothing is left."""
    import torch

    call = vars(torch.nn.Module)["__call__"]
    backward = torch.autograd.backward
    torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # SGD's step wrapper exists now
    step_code = torch.optim.SGD.step.__code__
    code, *_ = exec_in(
        "--start", "1", "--keep-running", "-o", str(tmp_path / "t.json"), "loop.py", "--steps", "2"
    )
    assert code == 0
    assert vars(torch.nn.Module)["__call__"] is call and torch.autograd.backward is backward
    assert torch.optim.SGD.step.__code__ is step_code


def test_stopped_after_the_window_in_a_real_process(tmp_path):
    """A subprocess, as users run it: exit 0, the script's own output stops at the window's end."""
    env = dict(os.environ, HOOKTRACE_TEST_LOG=str(tmp_path / "hooks.log"))
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "exec", "--start", "1", "-o", str(tmp_path / "t.json"), "loop.py", "--steps", "4"],
        cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "finished" not in done.stdout
    assert _traced(hooktrace.load(tmp_path / "t.json")) == _logged(tmp_path / "hooks.log", 1, 1)


def test_a_hook_registered_in_the_loop_accumulates(exec_in, tmp_path):
    out_path = tmp_path / "t.json"
    code, _out, err, log = exec_in("--start", "1", "--steps", "2", "-o", str(out_path), "leak.py")
    assert code == 0, err
    trace = hooktrace.load(out_path)
    assert _traced(trace) == _logged(log, 1, 2) == ["log_output"] * (2 + 3)
    [found] = [s for s in trace.surprises if s.rule == "accumulating"]
    assert "2 in step 0, 3 in step 1" in found.message
    code, _out, err, log = exec_in("--start", "1", "--steps", "2", "-o", str(out_path), "leak.py", "--remove")
    trace = hooktrace.load(out_path)
    assert _traced(trace) == _logged(log, 1, 2) == ["log_output"] * 2
    assert "accumulating" not in [s.rule for s in trace.surprises]


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_stops_the_script_with_the_partial_trace(tmp_path, name, code):
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "exec", "--steps", "5", "-o", str(tmp_path / "t.json"), "signals.py", name],
        cwd=SCRIPTS, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: signal.signal(getattr(signal, name), signal.SIG_DFL),  # even under nohup / a job
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert "not stopped" not in done.stdout
    assert f"stopped by {name}: the trace above is partial" in done.stderr
    trace = hooktrace.load(tmp_path / "t.json")
    assert {e.step for e in trace.events} == {0, 1, 2}


def test_check_against_a_golden_trace(exec_in, tmp_path):
    golden = tmp_path / "golden.txt"
    code, _out, err, _log = exec_in("--start", "1", "-o", str(golden), "loop.py", "--steps", "3")
    assert code == 0, err
    code, out, err, _log = exec_in("--start", "1", "--check", str(golden), "-q", "loop.py", "--steps", "3")
    assert code == 0, err
    assert out == ""  # -q: nothing when the orders are equal
    code, _out, err, _log = exec_in("--start", "1", "--check", str(golden), "leak.py")
    assert code == 1


def test_check_quiet_says_nothing_when_equal_even_with_notes(exec_in, tmp_path):
    """exec's notes (no optimizer.step() to mark steps by) stay unsaid with --check -q when equal."""
    (tmp_path / "fwd.py").write_text(
        "import torch\nm = torch.nn.Linear(2, 2)\nm.register_forward_hook(lambda *a: None)\n"
        "for _ in range(2):\n    m(torch.ones(1, 2))\n",
        encoding="utf-8",
    )
    golden = tmp_path / "golden.txt"
    code, _out, err, _log = exec_in("-o", str(golden), str(tmp_path / "fwd.py"))
    assert code == 0 and "note:" in err, err  # the oracle: this script has notes
    code, out, err, _log = exec_in("--check", str(golden), "-q", str(tmp_path / "fwd.py"))
    assert (code, out, err) == (0, "", ""), err


def test_a_ddp_comm_hook_is_named_by_its_own_code(exec_in, tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    out_path = tmp_path / "ddp.json"
    code, out, err, log = exec_in("--steps", "50", "-o", str(out_path), "ddp.py", "--steps", "2")
    assert code == 0, err
    trace = hooktrace.load(tmp_path / "ddp.rank0.json")
    assert _traced(trace) == _logged(Path(f"{log}.rank0"), 0, 99)  # the order the hooks recorded
    [comm] = [h for h in trace.hooks if h.kind == "comm"]
    line = next(
        i
        for i, t in enumerate((SCRIPTS / "ddp.py").read_text().splitlines(), 1)
        if "def allreduce_logged" in t
    )
    # the hook's own file and line, not hooktrace's trampoline (`<hooktrace-comm>:2`)
    assert (comm.name, comm.defined_at, comm.registered_at) == (
        "allreduce_logged",
        f"ddp.py:{line}",
        "ddp.py:46",
    )
