"""`hooktrace exec SCRIPT` as a process, against `python SCRIPT`: the same standard output, exit code
and exception, whatever the script does to its process (forks, changes folder, swaps or closes its
standard streams, sets its own `sys.excepthook`, empties `sys.argv`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hooktrace

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _python(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )


def _script(tmp_path: Path, text: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def both(
    tmp_path: Path, text: str, *exec_args: str, name: str = "script.py"
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """(`python SCRIPT`, `hooktrace exec EXEC_ARGS SCRIPT`), both run in `tmp_path`."""
    _script(tmp_path, text, name)
    plain = _python(tmp_path, name)
    traced = _python(tmp_path, "-m", "hooktrace", "exec", *exec_args, name)
    return plain, traced


def _fired(path: Path) -> list[str]:
    """The names of the hooks whose calls a trace file holds."""
    trace = hooktrace.load(path)
    return [trace.hook(e.hook).name for e in trace.events if e.hook is not None]


# -- fork -------------------------------------------------------------------------------------------

_DATALOADER = """
    import torch
    from torch.utils.data import DataLoader, Dataset

    record = []

    class Made(Dataset):  # its module runs in the workers: forward hooks fire in the children
        def __init__(self):
            self.lin = torch.nn.Linear(2, 2)
            self.lin.register_forward_hook(lambda m, i, o: None)
        def __len__(self):
            return 8
        def __getitem__(self, i):
            with torch.no_grad():
                return self.lin(torch.full((2,), float(i)))

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    def parent_hook(m, i, o):
        record.append("parent_hook")
    model.register_forward_hook(parent_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Made(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    steps = 0
    for epoch in range(2):
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            steps += 1
    print("steps", steps, "hooks", len(record), "weight", round(float(model.weight.sum()), 4))
"""


@pytest.mark.parametrize("window", [("--step-on", "forward", "--start", "1"), ("--start", "2")])
def test_dataloader_fork_workers_run_as_untraced(tmp_path, window):
    """DataLoader workers are forked children: they inherit the open window and the step watch, but
    count no step, are never stopped and write nothing; the parent's trace holds the parent's hooks."""
    out = tmp_path / "run.json"
    plain, traced = both(tmp_path, _DATALOADER, *window, "--keep-running", "-o", str(out))
    assert plain.returncode == 0, plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    assert "Traceback" not in traced.stderr and traced.stderr.count("wrote ") == 1, traced.stderr
    assert _fired(out) == ["parent_hook"], _fired(out)


def test_a_dataloader_fork_child_is_not_stopped_at_the_window_s_end(tmp_path):
    plain, traced = both(tmp_path, _DATALOADER, "--step-on", "forward", "--start", "1")
    # the parent is stopped after its window (step 1): it printed nothing, and its workers died of nothing
    assert (traced.returncode, traced.stdout.count("steps")) == (0, 0), traced.stderr
    assert "Traceback" not in traced.stderr and "exited unexpectedly" not in traced.stderr, traced.stderr


_FORK = """
    import os, sys
    import torch

    model = torch.nn.Linear(2, 1)
    def hook(m, i, o):
        print("hook in", "child" if os.getpid() != parent else "parent", flush=True)
    model.register_forward_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child steps too, and ends by returning from the script
        model(torch.ones(2)).sum().backward()
        opt.step()
        print("child done", flush=True)
        sys.exit(3)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    for _ in range(2):
        model(torch.ones(2)).sum().backward()
        opt.step()
    print("parent done", flush=True)
"""


def test_a_forked_child_counts_no_step_and_writes_nothing(tmp_path):
    out = tmp_path / "run.json"
    plain, traced = both(tmp_path, _FORK, "--keep-running", "-o", str(out))
    assert plain.returncode == 0 and "child exit 3" in plain.stdout, plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    assert traced.stderr.count("wrote ") == 1 and "note:" in traced.stderr, traced.stderr
    assert _fired(out) == ["hook"], "the parent's window is in the trace"


# -- an uncaught exception: its traceback and the script's sys.excepthook -------------------------

_RAISES = """
    import sys
    import torch

    MODE = sys.argv[1]
    if MODE == "excepthook":
        def shown(kind, value, tb):  # the script's own: python calls it with the script's frames
            frames = []
            while tb is not None:
                frames.append(f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_frame.f_code.co_name}")
                tb = tb.tb_next
            print("excepthook", kind.__name__, value, frames, flush=True)
        sys.excepthook = shown

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    def forward_hook(m, i, o):
        if MODE != "backward":
            raise ValueError("from a forward hook")
    def grad_hook(grad):
        raise KeyError("from a tensor hook in backward")
    model[1].register_forward_hook(forward_hook)
    def step():
        out = model(torch.ones(2, requires_grad=True))
        out.register_hook(grad_hook)
        try:
            out.sum().backward()
        except KeyError as exc:
            raise RuntimeError("backward failed") from exc
    step()
"""


@pytest.mark.parametrize("mode", ["forward", "backward", "excepthook"])
def test_an_uncaught_exception_is_shown_as_python_shows_it(tmp_path, mode):
    """The traceback is python's, frame for frame (no `<frozen runpy>`, no `<hooktrace-shim-N>`, no
    hooktrace wrapper between the script's frames), and a script's own sys.excepthook is called."""
    out = tmp_path / "run.json"
    _script(tmp_path, _RAISES)
    plain = _python(tmp_path, "script.py", mode)
    traced = _python(tmp_path, "-m", "hooktrace", "exec", "-o", str(out), "script.py", mode)
    expected = plain.stdout
    if mode == "excepthook":  # the capture's module call stands in for _wrapped_call_impl (README)
        expected = expected.replace("'module.py:_wrapped_call_impl', ", "")
    assert plain.returncode == 1 and (traced.returncode, traced.stdout) == (1, expected), traced.stderr
    assert plain.stderr in traced.stderr, traced.stderr  # the same traceback, whole
    assert "frozen runpy" not in traced.stderr and "hooktrace-shim" not in traced.stderr, traced.stderr
    assert "run failed: " in traced.stderr and out.exists()
    if mode == "excepthook":
        assert plain.stdout.startswith("excepthook ValueError from a forward hook"), plain.stdout


# -- the standard streams the script leaves --------------------------------------------------------

_STREAMS = """
    import contextlib, io, sys
    import torch

    model = torch.nn.Linear(2, 1)
    model.register_forward_hook(lambda m, i, o: None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    buffer = io.StringIO()
    if sys.argv[1] == "close":
        print("closing", flush=True)
        sys.stdout.close()
    with contextlib.redirect_stdout(buffer):  # the window closes in here
        for _ in range(2):
            model(torch.ones(2)).sum().backward()
            opt.step()
    if sys.argv[1] != "close":
        print("captured", len(buffer.getvalue()), flush=True)
"""


@pytest.mark.parametrize("how", ["redirect", "close"])
def test_the_tree_goes_to_the_process_s_standard_output(tmp_path, how):
    """The window closes while the script's stdout is a `redirect_stdout` buffer: the tree goes to the
    process's standard output, not into the script's buffer; a script that closes its sys.stdout
    still gets its exit code."""
    _script(tmp_path, _STREAMS)
    plain = _python(tmp_path, "script.py", how)
    traced = _python(tmp_path, "-m", "hooktrace", "exec", "--keep-running", "script.py", how)
    assert plain.returncode == 0 and plain.stdout == ("closing\n" if how == "close" else "captured 0\n")
    assert traced.returncode == 0, traced.stderr
    shown = traced.stdout.startswith(plain.stdout) if how == "close" else traced.stdout.endswith(plain.stdout)
    assert shown and "Linear" in traced.stdout, traced.stdout


_CHECKED = """
    import io, sys
    import torch

    model = torch.nn.Linear(2, 1)
    model.register_forward_hook(lambda m, i, o: None)
    if sys.argv[1] == "more":
        model.register_forward_pre_hook(lambda m, i: None)
        sys.stderr = io.StringIO()  # the script's own stderr: a buffer it never reads
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(2)).sum().backward()
        opt.step()
"""


def test_check_differences_go_to_the_process_s_standard_error(tmp_path):
    """`exec --check GOLDEN` prints the differences on the standard error the command started with,
    not into a buffer the script put in sys.stderr."""
    _script(tmp_path, _CHECKED)
    golden = _python(tmp_path, "-m", "hooktrace", "exec", "-o", "golden.json", "script.py", "same")
    assert golden.returncode == 0, golden.stderr
    traced = _python(tmp_path, "-m", "hooktrace", "exec", "--check", "golden.json", "script.py", "more")
    assert traced.returncode == 1, traced.stderr
    assert "hook order differs" in traced.stderr and "forward_pre hooks" in traced.stderr, traced.stderr


# -- the working folder ----------------------------------------------------------------------------

_CHDIR = """
    import os
    import torch

    start = os.getcwd()
    model = torch.nn.Linear(2, 1)
    model.register_forward_hook(lambda m, i, o: os.chdir(os.path.join(start, "elsewhere")))  # as Hydra
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(2)).sum().backward()
        opt.step()
    print("in", os.path.basename(os.getcwd()))
"""

_CHDIR_FACTORY = """
    import os
    import torch

    def make():
        os.chdir("elsewhere")
        return torch.nn.Linear(2, 1), torch.ones(1, 2)
"""


@pytest.mark.parametrize("command", ["exec", "run"])
def test_relative_paths_are_where_the_command_started(tmp_path, command):
    """A hook (exec) or the factory (run) changes the working folder: a relative -o is still written
    where the command started."""
    (tmp_path / "elsewhere").mkdir()
    if command == "exec":
        plain, traced = both(tmp_path, _CHDIR, "--keep-running", "-o", "run.json")
        assert (traced.returncode, traced.stdout) == (0, plain.stdout) == (0, "in elsewhere\n"), traced.stderr
    else:
        _script(tmp_path, _CHDIR_FACTORY, "factory.py")
        traced = _python(tmp_path, "-m", "hooktrace", "run", "factory.py:make", "-o", "run.json")
        assert traced.returncode == 0, traced.stderr
    assert (tmp_path / "run.json").is_file() and not (tmp_path / "elsewhere" / "run.json").exists()
    hooktrace.load(tmp_path / "run.json")


# -- hostile input: how the script is given, what it does to hooktrace's own state ------------------

_FROM_PIPE = """
    import sys
    import torch

    model = torch.nn.Linear(2, 1)
    def piped_hook(m, i, o):
        print("hook ran", flush=True)
    model.register_forward_hook(piped_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2)).sum().backward()
    opt.step()
    print("argv", sys.argv, __file__, flush=True)
"""


def _from_pipe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python ARGS /dev/fd/N` with the script in a pipe (what a shell's `<(...)` gives)."""
    read, write = os.pipe()
    os.write(write, textwrap.dedent(_FROM_PIPE).encode())
    os.close(write)
    try:
        return subprocess.run(
            [sys.executable, *args, f"/dev/fd/{read}"], cwd=tmp_path, env=_env(), capture_output=True,
            text=True, timeout=240, pass_fds=(read,),
        )  # fmt: skip
    finally:
        os.close(read)


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_a_script_from_a_pipe_runs_as_python_runs_it(tmp_path):
    """`hooktrace exec <(...)`: the script is read once, from the pipe, and runs (it ran nothing and
    exited 0: runpy's importer probe read the pipe first)."""
    plain = _from_pipe(tmp_path)
    traced = _from_pipe(tmp_path, "-m", "hooktrace", "exec", "--keep-running", "-o", "run.json")
    assert plain.returncode == 0 and plain.stdout.startswith("hook ran\nargv ['/dev/fd/"), plain
    assert (traced.returncode, traced.stdout) == (
        0,
        plain.stdout.replace(plain.stdout[14:], traced.stdout[14:]),
    )
    assert traced.stdout.split("'")[1].startswith("/dev/fd/"), traced.stdout  # argv[0] as python gives it
    assert _fired(tmp_path / "run.json") == ["piped_hook"]


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_a_script_from_a_pipe_with_nproc_is_one_error_line(tmp_path):
    """`exec --nproc 2 <(...)`: each rank would read the pipe (it is read once, and not passed to the
    ranks): refused before any rank starts, exit 2, one line (it said "script not found")."""
    traced = _from_pipe(tmp_path, "-m", "hooktrace", "exec", "--nproc", "2", "-o", "run.json")
    assert traced.returncode == 2 and traced.stderr.startswith("error: /dev/fd/"), traced.stderr
    assert traced.stderr.count("\n") == 1 and "a pipe is read once" in traced.stderr, traced.stderr
    assert traced.stdout == "" and not list(tmp_path.iterdir())


_PACKAGE_MAIN = """
    import torch
    from pkg import model

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2)).sum().backward()
    opt.step()
    print("ran", flush=True)
"""
_PACKAGE_INIT = """
    import os
    import torch

    model = torch.nn.Linear(2, 1)
    def init_hook(m, i, o):
        pass
    model.register_forward_hook(init_hook)
    if os.environ.get("PKG_RAISES"):
        raise ZeroDivisionError("pkg/__init__.py raised")
"""


def test_module_whose_package_raises_is_the_script_s_error(tmp_path, monkeypatch):
    """`exec -m pkg.sub` where `pkg/__init__.py` raises: user code, so exit 1 with python's traceback
    (no runpy frame) and the partial trace written, not "cannot find module"; a package that does not
    raise runs its `__init__` once, inside exec's watch (the hook it registers has its call site)."""
    (tmp_path / "pkg").mkdir()
    _script(tmp_path, _PACKAGE_INIT, "pkg/__init__.py")
    _script(tmp_path, _PACKAGE_MAIN, "pkg/sub.py")
    run = ["-m", "hooktrace", "exec", "-o", "run.json", "-m", "pkg.sub"]
    fine = _python(tmp_path, *run)
    assert (fine.returncode, fine.stdout) == (0, ""), fine.stderr  # stopped at the window's end
    hooks = hooktrace.load(tmp_path / "run.json").hooks
    assert [(h.name, (h.registered_at or "").split(":")[0]) for h in hooks] == [
        ("init_hook", "pkg/__init__.py")
    ]
    os.remove(tmp_path / "run.json")
    monkeypatch.setenv("PKG_RAISES", "1")
    plain = _python(tmp_path, "-m", "pkg.sub")
    traced = _python(tmp_path, *run)
    assert plain.returncode == traced.returncode == 1, traced.stderr
    tail = plain.stderr[plain.stderr.index('  File "' + str(tmp_path)) :]  # python's, after runpy's frames
    assert "Traceback (most recent call last):\n" + tail in traced.stderr, traced.stderr
    assert "frozen runpy" not in traced.stderr and "error:" not in traced.stderr, traced.stderr
    assert (tmp_path / "run.json").exists()


@pytest.mark.parametrize("name", ["pkg.nosuch", "nosuch.sub", "pkg"])
def test_module_not_found_is_one_error_line(tmp_path, name):
    """A module that is not there (a package with no such module, no such package, a package with no
    `__main__`): exit 2, one `error:` line, no traceback, nothing written."""
    (tmp_path / "pkg").mkdir()
    _script(tmp_path, "", "pkg/__init__.py")
    traced = _python(tmp_path, "-m", "hooktrace", "exec", "-o", "run.json", "-m", name)
    assert traced.returncode == 2 and traced.stderr.startswith("error: "), traced.stderr
    assert traced.stderr.count("\n") == 1 and name.split(".")[-1] in traced.stderr, traced.stderr
    assert not (tmp_path / "run.json").exists()


_OWN_TRACE = """
    import torch, hooktrace

    model = torch.nn.Linear(2, 1)
    model.register_forward_hook(lambda m, i, o: None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        with hooktrace.trace(model) as t:
            model(torch.ones(2)).sum().backward()
        opt.step()
        print("step", step, [(e.type, e.kind) for e in t.trace.events], flush=True)
"""


@pytest.mark.parametrize("start", ["0", "1"])
def test_a_script_s_own_trace_works_under_exec(tmp_path, start):
    """A script that uses `hooktrace.trace()` itself: its traces are what they are untraced (the
    registration watch steps aside before the window; the window ends where the script's own trace
    opens in it, one capture at a time), and exec writes what it traced (it failed: another
    capture's registration patches, or "already active")."""
    plain, traced = both(tmp_path, _OWN_TRACE, "--keep-running", "--start", start, "-o", "run.json")
    assert plain.returncode == 0 and plain.stdout.count("step") == 3, plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    assert "opened its own hooktrace.trace() inside the window" in traced.stderr, traced.stderr
    assert hooktrace.load(tmp_path / "run.json").meta.warmup == int(start)


_ARGV = """
    import sys
    print("argv", sys.argv, flush=True)
    sys.argv[:] = []
    import torch
    model = torch.nn.Linear(2, 1)
    model.register_forward_hook(lambda m, i, o: None)
    model(torch.ones(2))
    print("emptied", sys.argv, flush=True)
"""


@pytest.mark.parametrize("how", ["file", "module"])
def test_a_script_that_empties_sys_argv(tmp_path, how):
    """`sys.argv[:] = []` in the script: it ends as under python (runpy's IndexError, putting back
    argv[0], ended it with exit 1), and argv was what python gives (argv[0] as typed, not absolute)."""
    _script(tmp_path, _ARGV, "argv_script.py")
    target = ["argv_script.py"] if how == "file" else ["-m", "argv_script"]
    plain = _python(tmp_path, *target, "a")
    traced = _python(tmp_path, "-m", "hooktrace", "exec", "--keep-running", "-o", "run.json", *target, "a")
    assert plain.returncode == 0 and "emptied []" in plain.stdout, plain.stderr
    assert (traced.returncode, traced.stdout) == (0, plain.stdout), traced.stderr
    assert (tmp_path / "run.json").exists()


# -- --step-on forward in a training loop -----------------------------------------------------------

_FORWARD_STEPS = """
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    record = []
    model[0].register_forward_hook(lambda m, i, o: record.append("forward"))
    def backward_hook(m, grad_input, grad_output):
        record.append("backward")
        print("hooks so far", record, flush=True)
    model[0].register_full_backward_hook(backward_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        out = model(torch.ones(1, 2, requires_grad=True))
        if {train}:
            out.sum().backward()
            opt.step()
"""


@pytest.mark.parametrize("train", [True, False])
def test_step_on_forward_says_when_a_backward_of_an_earlier_forward_ran_in_the_window(tmp_path, train):
    """`exec -m pkg.train --step-on forward --start 1`: the window opens at the end of step 0's forward,
    whose backward then runs inside it: the hook's own record has that backward call, the trace does
    not, and a note says why (it said nothing). An inference loop (no backward) gets no such note."""
    (tmp_path / "pkg").mkdir()
    _script(tmp_path, "", "pkg/__init__.py")
    _script(tmp_path, _FORWARD_STEPS.replace("{train}", str(train)), "pkg/train.py")
    run = [
        "-m",
        "hooktrace",
        "exec",
        "--step-on",
        "forward",
        "--start",
        "1",
        "-o",
        "run.json",
        "-m",
        "pkg.train",
    ]
    traced = _python(tmp_path, *run)
    assert traced.returncode == 0, traced.stderr
    kinds = [e.kind for e in hooktrace.load(tmp_path / "run.json").hook_events()]
    assert kinds == ["forward"], kinds  # the window's forward; its backward runs after the window
    said = "that forward's backward ran inside the window untraced" in traced.stderr
    silent = [s for s in hooktrace.load(tmp_path / "run.json").surprises if s.rule == "never-fired"]
    assert len(silent) == 1 and "`backward_hook`" in silent[0].message, silent
    unseen = "the backward of step 0's forward ran inside the window untraced"
    if train:
        assert traced.stdout == "hooks so far ['forward', 'backward']\n"  # it ran, in the window
        assert said, traced.stderr
        # never-fired names the backward it may have run in (it said only "the trace does not show")
        assert unseen in silent[0].message and silent[0].level == "info", silent
    else:
        assert traced.stdout == "" and not said, traced.stderr
        assert unseen not in silent[0].message and silent[0].level == "warn", silent
