"""How a run ends when something goes wrong (issues 13 and 14): exit codes, one-line errors, partial
traces, signals, failed writes, and input mistakes decided by where the exception came from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.cli import main
from hooktrace.options import RunOptions, UsageError
from hooktrace.runs.factory import run as run_target
from hooktrace.target import Factory, load_factory

from .test_cli import RUN_OPTS, SAMPLES, invoke, restore_global_hooks, script, write  # noqa: F401

CNN = """
    import torch
    from torch import nn

    def make():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten())
"""
EMBEDDING = """
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 2)

        def forward(self, ids):
            return self.head(self.embed(ids))

    def make():
        return Net()
"""


def one_error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return code, lines[0]


# -- the first forward on generated --input tensors ------------------------------------------------


def test_a_dtype_the_model_cannot_take_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cnn = write(tmp_path / "cnn_int.py", CNN)
    code, line = one_error_line(["run", str(cnn), "--input", "2x3x16x16", "--dtype", "int64"], capsys)
    assert code == 2
    assert "rejected --input 2x3x16x16 --dtype int64" in line and "module '0'" in line
    assert "--dtype float32" in line


def test_float_inputs_to_an_embedding_suggest_int64(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emb = write(tmp_path / "emb_float.py", EMBEDDING)
    code, line = one_error_line(["run", str(emb), "--input", "2x5"], capsys)
    assert code == 2
    assert "module 'embed'" in line and "Embedding takes indices: add --dtype int64" in line
    assert invoke("run", str(emb), "--input", "2x5", "--dtype", "int64", "-f", "json")[0] == 0


def test_a_shape_error_is_judged_by_where_it_was_raised_not_by_its_words(tmp_path: Path) -> None:
    """Same message, three places: the model's forward (usage), a hook (run error), step 1 (run error)."""
    target = write(
        tmp_path / "picky.py",
        """
        from torch import nn

        CALLS = []

        class Picky(nn.Linear):
            def forward(self, x):
                CALLS.append("forward")
                if len(CALLS) == FAIL_AT:
                    raise RuntimeError("nothing about shapes here")
                return super().forward(x)

        def hook(module, args):
            if HOOK_FAILS:
                raise RuntimeError("nothing about shapes here")

        FAIL_AT, HOOK_FAILS = 1, False

        def make():
            model = nn.Sequential(Picky(3, 3))
            model.register_forward_pre_hook(hook)
            return model
        """,
    )
    factory = load_factory(str(target))
    module = sys.modules["picky"]
    with pytest.raises(UsageError, match="rejected --input 2x3: module '0' raised RuntimeError"):
        run_target(factory, RunOptions(input_shapes=("2x3",)))
    module.CALLS.clear()
    module.FAIL_AT = 2  # the second step's forward: the inputs were fine in step 0
    result = run_target(factory, RunOptions(input_shapes=("2x3",), steps=2))
    assert result.exception is not None and "module '0' raised RuntimeError" in (result.error or "")
    module.CALLS.clear()
    module.FAIL_AT, module.HOOK_FAILS = 0, True  # a hook: an error of the run, not of the inputs
    result = run_target(factory, RunOptions(input_shapes=("2x3",)))
    assert result.exception is not None and "forward_pre hook hook raised" in (result.error or "")


def test_too_many_inputs_huge_inputs_and_meta_models_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    linear = write(tmp_path / "lin.py", "from torch import nn\n\ndef make():\n    return nn.Linear(4, 2)\n")
    meta = write(
        tmp_path / "meta_model.py",
        "import torch\nfrom torch import nn\n\ndef make():\n    return nn.Linear(4, 2, device='meta'), torch.ones(4)\n",
    )
    cases = [
        (
            ["run", str(linear), "--input", "2x4", "--input", "2x4"],
            "2 --input given but Linear.forward takes 1",
        ),
        (
            ["run", str(linear), "--input", "100000000000x4"],
            "cannot make a tensor of 400,000,000,000 elements",
        ),
        (["run", str(meta)], "all on the meta device"),
    ]
    for args, words in cases:
        code, line = one_error_line(args, capsys)
        assert code == 2 and words in line, (args, line)


def test_inputs_follow_the_first_parameter_not_on_meta_and_a_note_says_so(tmp_path: Path) -> None:
    target = write(
        tmp_path / "offloaded.py",
        """
        import torch
        from torch import nn

        SEEN = []

        def make():
            model = nn.Sequential(nn.Linear(4, 4, device="meta"), nn.Linear(4, 2))
            model[1].register_forward_pre_hook(lambda m, args: SEEN.append(args[0].device.type))
            model[0].forward = lambda x: torch.zeros(x.shape[0], 4, device=x.device)  # offload-style
            return model, torch.ones(3, 4)
        """,
    )
    code, _, err = invoke("run", str(target), "-f", "json", "--no-backward")
    assert code == 0, err
    assert sys.modules["offloaded"].SEEN == ["cpu"]
    assert "note: inputs on cpu, the device of parameter '1.weight' (the first not on meta" in err


# -- sys.exit and other BaseExceptions ----------------------------------------------------------------


def test_sys_exit_in_a_factory_is_a_factory_error_and_in_a_hook_a_run_error(tmp_path: Path) -> None:
    quits = write(tmp_path / "quits.py", "import sys\n\ndef make():\n    sys.exit(3)\n")
    hook_quits = write(
        tmp_path / "hook_quits.py",
        """
        import sys
        import torch
        from torch import nn

        def make():
            model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
            model[1].register_forward_hook(lambda m, a, o: sys.exit(4))
            return model, torch.ones(1, 2)
        """,
    )
    class_base = write(
        tmp_path / "base_exc.py",
        "class Odd(BaseException):\n    pass\n\ndef make():\n    raise Odd('not an Exception')\n",
    )
    out = tmp_path / "partial.json"
    procs = [
        script("run", str(quits)),
        script("run", str(hook_quits), "-o", str(out)),
        script("run", str(class_base)),
    ]
    assert procs[0].returncode == 2 and procs[0].stderr.splitlines() == [
        "error: the factory make() called sys.exit(3); return the model instead"
    ]
    assert procs[1].returncode == 1, procs[1].stderr
    assert "Traceback" not in procs[1].stderr
    assert (
        "forward hook make.<locals>.<lambda> raised SystemExit: 4" in procs[1].stderr
        and "module '1'" in procs[1].stderr
    )
    events = hooktrace.load(out).hook_events()
    assert [e.error for e in events] == ["SystemExit: 4"]
    assert procs[2].returncode == 2 and procs[2].stderr.splitlines() == [
        "error: the factory make() raised Odd: not an Exception; fix it (--traceback shows where)"
    ]


def test_an_unexpected_exception_is_one_clean_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug of ours (here: loading raises TypeError) must not end in a double traceback."""
    import hooktrace.cli as cli

    def broken(path: Path) -> None:
        raise TypeError("a bug in hooktrace")

    monkeypatch.setattr(cli, "load_side_file", broken)
    code, line = one_error_line(["diff", "a.json", "b.json"], capsys)
    assert (
        code == 1
        and line == "error: hooktrace stopped on TypeError: a bug in hooktrace (--traceback shows where)"
    )
    assert main(["diff", "a.json", "b.json", "--traceback"]) == 1
    assert "Traceback" in capsys.readouterr().err


# -- SIGINT / SIGTERM ----------------------------------------------------------------------------------

LOOPING = """
    import os
    import time
    import torch
    from torch import nn

    def spin(module, args):
        open(os.environ["HT_STARTED"], "w").close()
        while True:
            time.sleep(0.01)

    def make():
        model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        model[0].register_forward_hook(lambda m, a, o: None)
        model[1].register_forward_pre_hook(spin)
        return model, torch.ones(1, 2)
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_with_the_partial_trace_written(tmp_path: Path, sig: int, code: int) -> None:
    target = write(tmp_path / "looping.py", LOOPING)
    started, out = tmp_path / "started", tmp_path / "partial.json"
    env = dict(os.environ, HT_STARTED=str(started))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hooktrace", "run", str(target), "-o", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),  # a background job starts with SIGINT ignored
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert f"stopped by {signal.Signals(sig).name}" in err
    trace = hooktrace.load(out)
    names = [trace.hook(e.hook).name for e in trace.hook_events()]
    assert [n.rsplit(".", 1)[-1] for n in names] == ["<lambda>", "spin"]  # the interrupted hook last


def test_a_stopped_run_restores_every_hook_dict(tmp_path: Path) -> None:
    """In this process: the hook itself sends SIGTERM; the dicts hold what they held before."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    kept = model[0].register_forward_hook(lambda m, a, o: None)

    def stop(module: nn.Module, args: tuple) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    model[1].register_forward_pre_hook(stop)
    before = [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in model]
    handler = signal.getsignal(signal.SIGTERM)
    result = run_target(Factory("inline", lambda: (model, torch.ones(1, 2)), "make()"), stop_signals=True)
    assert result.stopped_by == signal.SIGTERM and result.exception is None
    after = [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in model]
    assert after == before and kept.id in model[0]._forward_hooks
    assert signal.getsignal(signal.SIGTERM) is handler  # ours is gone again
    assert [e.kind for e in result.trace.hook_events()] == ["forward", "forward_pre"]


# -- writing ---------------------------------------------------------------------------------------

_LIMITED = """
import resource, signal, sys
from hooktrace.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="POSIX file-size limits")
def test_a_write_past_the_file_size_limit_says_so_and_keeps_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    out.write_text("the earlier good trace")
    proc = subprocess.run(
        [sys.executable, "-c", _LIMITED, "run", str(SAMPLES / "quickstart.py"), "-o", str(out)], **RUN_OPTS
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: cannot write {out}: File too large (a file-size limit, see ulimit -f); nothing was overwritten"
    ]
    assert out.read_text() == "the earlier good trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temporary file left


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="POSIX file-size limits")
@pytest.mark.parametrize("fmt", ["tree", "json", "html"])
def test_standard_output_cut_short_by_a_file_size_limit_is_an_error_not_exit_0(
    tmp_path: Path, fmt: str
) -> None:
    # `hooktrace run ... -f json > run.json` under `ulimit -f`: Python's buffered stdout took the short
    # write without a word, and a cut JSON document came with exit 0.
    args = [sys.executable, "-c", _LIMITED, "run", str(SAMPLES / "quickstart.py"), "-f", fmt]
    shown = tmp_path / "shown.txt"
    with shown.open("wb") as stdout:
        proc = subprocess.run(args, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: cannot write to standard output: File too large (a file-size limit, see ulimit -f); "
        "what it received is cut short"
    ]
    assert shown.stat().st_size == 2000  # the limit: what the shell's file got


def test_standard_output_is_whole_without_a_limit(tmp_path: Path) -> None:
    shown = tmp_path / "shown.json"
    with shown.open("wb") as stdout:
        proc = subprocess.run(
            [sys.executable, "-m", "hooktrace", "run", str(SAMPLES / "quickstart.py"), "-f", "json"],
            stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert hooktrace.load(shown).meta.target is not None  # whole, and a trace


def test_a_missing_folder_is_named_as_given_by_the_cli_and_absolute_by_a_rank_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from hooktrace.io import write_error_words

    monkeypatch.chdir(tmp_path)
    code, line = one_error_line(["run", str(SAMPLES / "quickstart.py"), "-o", "no/dir/x.json"], capsys)
    assert code == 2 and line.endswith("(the folder no/dir does not exist; create it first)"), line
    missing = OSError(errno.ENOENT, "No such file or directory")
    assert write_error_words(missing, "x/y.json").endswith(
        f"(the folder {tmp_path / 'x'} does not exist; create it first)"
    )
    assert write_error_words(missing, "x/y.json", absolute=False).endswith(
        "(the folder x does not exist; create it first)"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = one_error_line(
        ["run", str(SAMPLES / "quickstart.py"), "-f", "json", "-o", "/dev/full"], capsys
    )
    assert code == 2 and "No space left on device" in line and "check the folder" not in line


def test_a_run_that_fails_before_writing_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    out.write_text("earlier")
    bad = write(tmp_path / "bad_factory.py", "def make():\n    raise RuntimeError('no')\n")
    assert one_error_line(["run", str(bad), "-o", str(out)], capsys)[0] == 2
    code, line = one_error_line(
        ["run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "no" / "x.json")], capsys
    )
    assert code == 2 and "the folder" in line and "does not exist" in line
    assert out.read_text() == "earlier" and sorted(p.name for p in tmp_path.iterdir()) == [
        "bad_factory.py",
        "run.json",
    ]


def test_mark_step_outside_the_block_is_refused_clearly() -> None:
    """Issue 13: before the block it shifted every step (events step 2, meta.steps 3)."""
    model = nn.Linear(2, 2)
    session = hooktrace.trace(model)
    with pytest.raises(RuntimeError, match=r"mark_step\(\) works inside the `with hooktrace.trace"):
        session.mark_step()
    with session as t:
        model(torch.ones(1, 2))
    with pytest.raises(RuntimeError, match="inside the `with"):
        t.mark_step()
    assert t.trace.meta.steps == 1 and {e.step for e in t.trace.events} == {0}


ASYNC_FACTORY = """
import torch
from torch import nn


async def make():
    return nn.Linear(2, 2), torch.randn(1, 2)
"""


@pytest.mark.parametrize("command", ["run", "hooks"])
def test_an_async_factory_is_one_error_line_and_no_never_awaited_warning(tmp_path, command):
    import subprocess
    import sys

    factory = tmp_path / "asyncf.py"
    factory.write_text(ASYNC_FACTORY)
    script = str(Path(sys.executable).with_name("hooktrace"))
    done = subprocess.run([script, command, str(factory)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: the factory make() is async (it returned a coroutine); hooktrace calls it without an "
        "event loop: make it a plain def (it may call asyncio.run itself)"
    ]
