"""`hooktrace run --nproc N` with real ranks: processes over gloo on CPU, supervised through torch's
elastic launcher. Each launch takes a while (every rank imports torch), so there is one launch per
situation and several assertions read it. The pure parts are in test_ranks_result.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hooktrace.ranks import (
    DIED,
    FAILED,
    HUNG,
    OK,
    RanksResult,
    run_ranks,
)
from hooktrace.validate import load

from .rank_factories import HOOKTRACE, hooktrace_process, one_hook_factory

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


# -- real ranks: processes over gloo on CPU -----------------------------------------------------------
# Each launch costs every rank a torch import: one launch per situation, several assertions each.
# Timeouts are generous (8 s): on a loaded machine a healthy rank must not pass for a hung one.


def _no_run_folders(tmpdir: Path) -> list[str]:
    return [p.name for p in tmpdir.iterdir() if p.name.startswith(("hooktrace-", "torchelastic_"))]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RanksResult, Path]:
    out = tmp_path_factory.mktemp("fsdp") / "fsdp.json"
    out.with_name("fsdp.rank1.json").write_text("an earlier run's file")  # replaced, not merged
    result = run_ranks(
        f"{SAMPLES / 'fsdp_two_ranks.py'}:make",
        2,
        out=str(out),
        options={"steps": 2},
        timeout=60,
        show_rank=1,
    )
    return result, out


def test_fsdp_ranks_agree_and_write_one_trace_each(fsdp_run: tuple[RanksResult, Path]) -> None:
    result, out = fsdp_run
    assert [o.state for o in result.ranks] == [OK, OK], result.summary()
    assert result.exit_code == 0 and not result.diverged
    assert not out.exists()  # -o run.json names the rank files; there is no combined file
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "fsdp.rank0.json",
        "fsdp.rank1.json",
    ]  # no temp left
    for rank in (0, 1):
        path = out.with_name(f"fsdp.rank{rank}.json")
        assert result.ranks[rank].trace_path == str(path)
        data = json.loads(path.read_text())
        assert data["meta"]["rank"] == rank and data["meta"]["world_size"] == 2
        assert data["meta"]["steps"] == 2 and data["meta"]["target"].endswith("fsdp_two_ranks.py:make")
        assert set(data["events"]["columns"]["step"]) == {0, 1}
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
    out = tmp_path / "div.json.gz"
    result = run_ranks(f"{SAMPLES / 'rank_divergence.py'}:make", 2, out=str(out), timeout=60, show_rank=0)
    assert [o.state for o in result.ranks] == [OK, OK], result.summary()
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
    for rank in (0, 1):  # -o x.json.gz: every rank's file is compressed too
        path = tmp_path / f"div.rank{rank}.json.gz"
        assert path.read_bytes()[:2] == b"\x1f\x8b" and load(path).meta.rank == rank


CRASHING = """
import torch
import torch.distributed as dist
from torch import nn


def both_tracing(module, args):
    dist.barrier()  # rank 1 raises only once rank 0 is tracing too (not still loading the target)


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
    model[0].register_forward_pre_hook(both_tracing)
    model[1].register_forward_hook(sync)
    if dist.get_rank() == 1:
        model[0].register_forward_pre_hook(boom)
    return model, torch.randn(2, 4)
"""


def test_a_crashing_rank_stops_the_others_and_is_reported(tmp_path: Path) -> None:
    factory = tmp_path / "crashing.py"
    factory.write_text(CRASHING)
    result = run_ranks(str(factory), 2, out=str(tmp_path / "c.json"), timeout=30, show_rank=0)
    assert result.exit_code == 1
    one = result.ranks[1]
    assert one.state == FAILED, result.summary()
    assert one.error is not None and "RuntimeError: boom on rank 1" in one.error
    # the rank's traceback comes from its elastic error file, down to the user's hook
    assert one.traceback is not None and 'raise RuntimeError("boom on rank 1")' in one.traceback
    assert one.trace is not None and (tmp_path / "c.rank1.json").exists()  # the partial trace
    assert [h.name for h in one.trace.hooks if h.name == "boom"] == ["boom"]
    zero = result.ranks[0]
    assert zero.state != OK and zero.trace is not None  # stopped in its all_reduce, partial trace kept
    assert result.first_failure is one
    summary = result.summary()
    assert (
        "first to fail: rank 1 (failed): forward_pre hook boom raised RuntimeError: boom on rank 1" in summary
    )
    assert not result.timed_out


HANGING = """
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def stall(module, args):
    Path(os.environ["HANG_MARKS"], f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def make():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    if dist.get_rank() in {int(r) for r in os.environ["HANG_RANKS"].split(",")}:
        model[1].register_forward_pre_hook(stall)
    return model, torch.randn(2, 4)
"""


@pytest.fixture()
def hanging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    factory = tmp_path / "hanging.py"
    factory.write_text(HANGING)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("HANG_MARKS", str(marks))
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    return factory


def _stall_fired(trace: object) -> list[str]:
    return [trace.hook(e.hook).name for e in trace.hook_events()]  # type: ignore[attr-defined]


def test_a_hanging_rank_is_stopped_after_the_timeout_with_its_partial_trace(
    hanging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANG_RANKS", "1")
    start = time.monotonic()
    result = run_ranks(str(hanging), 2, out=None, timeout=8, show_rank=0)
    assert time.monotonic() - start < 120  # not the 600 s the hook sleeps
    assert result.timed_out and result.exit_code == 1
    assert result.ranks[0].state == OK
    hung = result.ranks[1]
    assert hung.state == HUNG, result.summary()
    assert hung.error is not None and "stall" in hung.error and "--timeout 8" in hung.error
    assert hung.trace is not None and _stall_fired(hung.trace) == ["stall"]  # partial: nothing after it
    assert hung.trace_path is None  # without -o the traces are read, not kept
    assert result.first_failure is hung
    assert "stopped every rank after --timeout 8s: rank 1 " in result.summary()
    assert _no_run_folders(hanging.parent / "tmp") == []


def test_timeout_fires_when_every_rank_hangs_even_a_single_one(
    hanging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANG_RANKS", "0")
    out = hanging.parent / "one.json"
    result = run_ranks(str(hanging), 1, out=str(out), timeout=8, show_rank=0)
    (only,) = result.ranks
    assert only.state == HUNG and result.exit_code == 1, result.summary()
    assert "made no progress for 8s while in step 0" in (only.error or "")
    assert only.trace is not None and _stall_fired(only.trace) == ["stall"]
    assert load(hanging.parent / "one.rank0.json").meta.rank == 0
    pid = int((hanging.parent / "marks" / "rank0.pid").read_text())
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("sig", "nproc", "code"),
    [
        (signal.SIGTERM, 2, 143),
        (signal.SIGINT, 1, 130),
        (signal.SIGHUP, 2, 129),  # the terminal closed: the ranks keep their partial traces too
        pytest.param(signal.SIGQUIT, 1, 131, marks=pytest.mark.slow),  # forwarded as SIGTERM
    ],
)
def test_a_signal_to_run_nproc_stops_every_rank_and_writes_the_partial_traces(
    hanging: Path, sig: signal.Signals, nproc: int, code: int
) -> None:
    marks = hanging.parent / "marks"
    out = hanging.parent / "out" / "sig.json"
    out.parent.mkdir()
    env = dict(os.environ, HANG_RANKS=",".join(str(r) for r in range(nproc)), PYTHONFAULTHANDLER="1")
    proc = hooktrace_process(
        "run", str(hanging), "--nproc", str(nproc), "-o", str(out), "--timeout", "600", env=env
    )

    def written() -> list[int]:  # a rank's mark exists before its pid is written in it
        return [int(text) for p in marks.iterdir() if (text := p.read_text().strip())]

    deadline = time.monotonic() + 240
    while len(written()) < nproc and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = written()
    assert len(pids) == nproc, proc.communicate(timeout=60)
    proc.send_signal(sig)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # where it is stuck: faulthandler (PYTHONFAULTHANDLER) on SIGABRT
        ranks = subprocess.run(
            ["ps", "-o", "pid,stat,etime,args", "--ppid", str(proc.pid)], capture_output=True
        )
        proc.send_signal(signal.SIGABRT)
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(
            f"the launcher did not end within 120 s of its {sig.name}:\n{ranks.stdout.decode()}\n{stdout}\n{stderr}"
        )
    assert proc.returncode == code, stdout + stderr
    assert not any(_alive(pid) for pid in pids)  # every rank ended with the launcher
    assert _no_run_folders(hanging.parent / "tmp") == []
    assert f"interrupted by {sig.name}" in stdout
    for rank in range(nproc):  # each rank wrote what it had: the hook it was stopped in
        trace = load(out.with_name(f"sig.rank{rank}.json"))
        assert _stall_fired(trace) == ["stall"] and trace.meta.rank == rank


def test_a_factory_name_that_does_not_exist_is_a_usage_error_and_keeps_earlier_traces(tmp_path: Path) -> None:
    factory = tmp_path / "model.py"
    factory.write_text("def make():\n    raise AssertionError('never called')\n")
    earlier = {r: tmp_path / f"u.rank{r}.json" for r in (0, 1)}
    for r, path in earlier.items():
        path.write_text(f"rank {r} of an earlier run")
    result = run_ranks(f"{factory}:nope", 2, out=str(tmp_path / "u.json"), timeout=30, show_rank=0)
    assert result.exit_code == 2, result.summary()
    assert result.usage_error is not None and "has no attribute 'nope'" in result.usage_error
    assert [o.trace for o in result.ranks] == [None, None]  # the earlier files are not this run's traces
    assert {r: p.read_text() for r, p in earlier.items()} == {
        r: f"rank {r} of an earlier run" for r in (0, 1)
    }


def test_timeout_zero_is_refused_before_anything_runs(tmp_path: Path) -> None:
    for value in ("0", "-1"):
        proc = hooktrace_process(
            "run", "missing.py", "--nproc", "2", "--timeout", value, env=dict(os.environ)
        )
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert stderr.splitlines() == [
            f"error: --timeout {value}: give a number of seconds more than 0 and at most 604800 (a week)"
        ]


BOOM = """
def boom(module, args, output):
    if os.environ.get("ABORT"):
        os.abort()  # the process dies from SIGABRT: no error file, only its stderr
    raise RuntimeError("boom in a forward hook")
"""


def test_traceback_shows_each_failed_rank_s_traceback_from_its_error_file(tmp_path: Path) -> None:
    factory = one_hook_factory(tmp_path / "failing.py", BOOM, "register_forward_hook")
    proc = hooktrace_process("run", str(factory), "--nproc", "1", "--traceback", env=dict(os.environ))
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 1, stdout + stderr
    assert (
        "rank 0: failed" in stdout
        and "forward hook boom raised RuntimeError: boom in a forward hook" in stdout
    )
    tb = stderr[stderr.index("rank 0 (failed):") :]
    assert "Traceback (most recent call last)" in tb and 'raise RuntimeError("boom in a forward hook")' in tb


def test_a_rank_killed_by_a_signal_died_and_its_last_words_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = one_hook_factory(tmp_path / "failing.py", BOOM, "register_forward_hook")
    monkeypatch.setenv("ABORT", "1")
    result = run_ranks(str(factory), 1, out=str(tmp_path / "d.json"), timeout=60)
    (only,) = result.ranks
    assert only.state == DIED and only.exitcode == -signal.SIGABRT, result.summary()
    assert only.error is not None and only.error.startswith("the rank's process died from SIGABRT")
    assert "failing.py" in only.error  # faulthandler's last line: where it died
    assert only.trace is None and not (tmp_path / "d.rank0.json").exists() and result.exit_code == 1


@pytest.mark.parametrize("nproc", [None, 1])
def test_under_a_file_size_limit_nproc_says_cannot_write_as_a_single_run_does(tmp_path: Path, nproc) -> None:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # ulimit -f 4: the trace is larger

    out = tmp_path / "f.json"
    args = ["run", str(SAMPLES / "quickstart.py"), "-o", str(out)] + (
        ["--nproc", str(nproc)] if nproc else []
    )
    done = subprocess.run(
        [str(HOOKTRACE), *args], capture_output=True, text=True, timeout=240, preexec_fn=limit
    )
    assert done.returncode == 2, done.stdout + done.stderr
    written = "f.rank{r}.json" if nproc else "f.json"
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        f"error: cannot write {tmp_path / written}: File too large (a file-size limit, see ulimit -f); "
        "nothing was overwritten"
    ]
    assert "Traceback" not in done.stderr and "crashed" not in done.stdout + done.stderr


DEEP_FAILURE = """
import torch
from torch import nn


def down(n):
    if n == 0:
        raise RuntimeError("boom at the bottom of a deep stack")
    return down(n - 1)


def boom(module, args, output):
    down(40)  # a traceback of some 4 KB: more than the file-size limit lets the error file hold


def make():
    model = nn.Linear(4, 4)
    model.register_forward_hook(boom)
    return model, torch.randn(2, 4)
"""


def _limited(limit: int, *args: str) -> subprocess.CompletedProcess:
    """`hooktrace ARGS` under `ulimit -f` of `limit` bytes; its output goes to pipes, which no limit cuts."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    script = Path(sys.executable).with_name("hooktrace")
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=240, preexec_fn=apply)


def test_under_a_1kb_file_size_limit_two_ranks_say_cannot_write_and_keep_earlier_files(
    tmp_path: Path,
) -> None:
    """The trace does not fit, nor does the rank's error file with its traceback: still `cannot write`."""
    out = tmp_path / "f.json"
    earlier = tmp_path / "f.rank0.json"
    earlier.write_text("an earlier run's trace")
    done = _limited(1024, "run", str(SAMPLES / "quickstart.py"), "-o", str(out), "--nproc", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        f"error: cannot write {tmp_path / 'f.rank{r}.json'}: File too large (a file-size limit, see ulimit -f); "
        "nothing was overwritten"
    ]
    assert "crashed" not in done.stdout + done.stderr and "without a word" not in done.stdout + done.stderr
    assert earlier.read_text() == "an earlier run's trace" and not (tmp_path / "f.rank1.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.rank0.json"]  # no temporary file left


def test_a_failing_rank_whose_error_file_does_not_fit_is_failed_with_its_error(tmp_path: Path) -> None:
    factory = tmp_path / "deep.py"
    factory.write_text(DEEP_FAILURE)
    out = tmp_path / "d.json"
    done = _limited(2048, "run", str(factory), "-o", str(out), "--nproc", "1", "--traceback")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 0: failed" in done.stdout, done.stdout
    assert "forward hook boom raised RuntimeError: boom at the bottom of a deep stack" in done.stdout
    assert "crashed" not in done.stdout + done.stderr and "without a word" not in done.stdout + done.stderr
    # --traceback: the rank's traceback did not fit in its error file, and that is what it says
    tb = done.stderr[done.stderr.index("rank 0 (failed):") :]
    assert "not kept: the rank's error file could not hold it: File too large" in tb and "ulimit -f" in tb
    assert load(str(tmp_path / "d.rank0.json")).hooks[0].name == "boom"  # the partial trace fits: kept


def test_under_a_zero_file_size_limit_nproc_cannot_make_its_log_folder_and_says_so(tmp_path: Path) -> None:
    done = _limited(0, "run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "z.json"), "--nproc", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: cannot create a temporary folder for the ranks' logs: ")
    assert error.endswith("(a file-size limit of 0 bytes is in force, see ulimit -f)")
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []
