"""Many ranks: `exec` under torchrun writes one trace per rank; `hooktrace ranks` compares them
(docs/contract.md, Scripts). The torchrun runs are real (gloo, DDP with a communication hook) and slow."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hooktrace
from hooktrace.cli import main

SCRIPTS = Path(__file__).parent / "scripts"


def _traced(trace: hooktrace.Trace) -> list[str]:
    by_id = {h.id: h.name for h in trace.hooks}
    return [by_id[e.hook] for e in trace.events if e.type == "hook"]


def _logged(path: Path, first: int, last: int) -> list[str]:
    names = []
    for line in path.read_text().splitlines():
        step, name = line.split()
        if first <= int(step) <= last:
            names.append(name)
    return names


def _rank_trace(tmp_path: Path, rank: int, world: int, extra: bool) -> Path:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].register_forward_hook(lambda m, a, o: None)
    if extra:
        model[1].register_forward_pre_hook(lambda m, a: None)
    with hooktrace.trace() as t:
        model(torch.randn(1, 2)).sum().backward()
    t.set_meta(rank=rank, world_size=world)
    path = tmp_path / f"run.rank{rank}.json"
    t.save(str(path))
    return path


def test_ranks_agree_and_diverge(tmp_path, capsys):
    a, b = _rank_trace(tmp_path, 0, 2, False), _rank_trace(tmp_path, 1, 2, False)
    assert main(["ranks", str(b), str(a)]) == 0  # any order: the files say their rank
    out = capsys.readouterr().out
    assert "ranks agree: same hook order on ranks 0, 1" in out
    c = _rank_trace(tmp_path, 1, 2, True)
    assert main(["ranks", str(a), str(c)]) == 1
    out = capsys.readouterr().out
    assert "ranks diverge: rank 1 differs from rank 0" in out and "forward_pre" in out


def test_ranks_bad_input(tmp_path, capsys):
    a = _rank_trace(tmp_path, 0, 2, False)
    assert main(["ranks", str(a), str(a)]) == 2
    assert "are both rank 0" in capsys.readouterr().err
    assert main(["ranks", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith("error: trace file not found")
    assert main(["ranks", str(a)]) == 1  # rank 1 of 2 missing
    assert "no trace given for rank 1" in capsys.readouterr().out


@pytest.mark.parametrize("world", [10**9, 2**62, 0, -3])
def test_ranks_with_a_world_size_past_any_job_is_one_error_line(tmp_path, capsys, world):
    """A world size read from a file is bounded: 10**9 listed its missing ranks in 12 GB."""
    a = _rank_trace(tmp_path, 0, world, False)
    for fmt in ((), ("-f", "html", "-o", str(tmp_path / "r.html"))):
        assert main(["ranks", str(a), *fmt]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "world_size" in err, err


def test_ranks_lists_many_missing_ranks_in_a_bounded_line(tmp_path, capsys):
    a = _rank_trace(tmp_path, 0, 5000, False)
    assert main(["ranks", str(a)]) == 1
    out = capsys.readouterr().out
    assert "no trace given for ranks 1, 2, 3" in out and "and 4979 more" in out and len(out) < 2000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], tmp_path: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, HOOKTRACE_TEST_LOG=str(log), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=SCRIPTS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check_ranks(tmp_path: Path, log: Path, n: int, first: int, last: int) -> list[str]:
    files = []
    for rank in range(n):
        path = tmp_path / f"ddp.rank{rank}.json"
        trace = hooktrace.load(path)
        assert (trace.meta.rank, trace.meta.world_size) == (rank, n)
        assert _traced(trace) == _logged(Path(f"{log}.rank{rank}"), first, last)
        assert "allreduce_logged" in _traced(trace)  # the comm hook, registered before the window
        files.append(str(path))
    return files


@pytest.mark.slow
@pytest.mark.parametrize("diverge", [False, True])
def test_torchrun_two_ranks(tmp_path, capsys, diverge):
    log = tmp_path / "hooks.log"
    args = ["--standalone", "--nproc-per-node", "2", "-m", "hooktrace", "exec", "-s", "1", "--steps", "2"]
    args += ["-o", str(tmp_path / "ddp.json"), "ddp.py", *(["--diverge"] if diverge else [])]
    proc = _torchrun(args, tmp_path, log)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "hooktrace ddp.py (rank 0 of" not in out  # with -o no rank prints its tree to stdout
    assert err.count("ddp.rank*.json (one trace per rank") == 1  # rank 0 says where they are
    files = _check_ranks(tmp_path, log, 2, 1, 2)
    capsys.readouterr()
    assert main(["ranks", *files]) == (1 if diverge else 0)
    summary = capsys.readouterr().out
    if diverge:
        assert "rank1_only" in summary and "ranks diverge" in summary
    else:
        assert "ranks agree" in summary


@pytest.mark.slow
def test_two_simulated_nodes(tmp_path, capsys):
    log = tmp_path / "hooks.log"
    port = _free_port()
    procs = [
        _torchrun(
            [
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "hooktrace-test",
                "-m",
                "hooktrace",
                "exec",
                "-o",
                str(tmp_path / "ddp.json"),
                "ddp.py",
                "--steps",
                "2",
            ],
            tmp_path,
            log,
        )  # fmt: skip
        for node in (0, 1)
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    files = _check_ranks(tmp_path, log, 4, 0, 0)
    capsys.readouterr()
    assert main(["ranks", *files]) == 0
    assert "ranks agree: same hook order on ranks 0, 1, 2, 3" in capsys.readouterr().out


@pytest.mark.slow
def test_exec_nproc(tmp_path):
    env = dict(os.environ, HOOKTRACE_TEST_LOG=str(tmp_path / "hooks.log"))
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "exec", "--nproc", "2", "-s", "1", "--shapes",
         "-o", str(tmp_path / "ddp.json"), "ddp.py", "--diverge"],
        cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    # the one launcher's outcome, as for run --nproc: the summary under the shown rank's tree
    assert "ranks diverge: rank 1 differs from rank 0" in done.stdout
    assert done.stdout.count("hooktrace ddp.py (rank 0 of 2)") == 1
    _check_ranks(tmp_path, tmp_path / "hooks.log", 2, 1, 1)
    for rank in range(2):  # --shapes reached every rank: each hook call says what it received
        trace = hooktrace.load(tmp_path / f"ddp.rank{rank}.json")
        assert all(e.shapes for e in trace.events if e.type == "hook"), rank


def _exec_nproc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOOKTRACE_TEST_LOG=str(tmp_path / "hooks.log"), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "hooktrace", "exec", "--nproc", "2", *args],
        cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_exec_nproc_check_compares_the_shown_rank_with_the_golden_file(tmp_path):
    """exec --nproc 2 --check GOLDEN exits 1 when the order differs, as exec and run --nproc do (the
    golden file was dropped on the way to the ranks: exit 0, 'ranks agree'); 0 when it is equal."""
    made = _exec_nproc(tmp_path, "-s", "1", "-o", str(tmp_path / "g.json"), "ddp.py", "--diverge")
    assert made.returncode == 1, made.stderr  # the ranks diverge: rank 1 has one hook more
    differs = _exec_nproc(tmp_path, "-s", "1", "--check", str(tmp_path / "g.rank1.json"), "ddp.py")
    assert differs.returncode == 1, differs.stderr
    assert "ranks agree" in differs.stdout  # the ranks agree; the golden file does not
    equal = _exec_nproc(tmp_path, "-s", "1", "--check", str(tmp_path / "g.rank0.json"), "-q", "ddp.py")
    assert equal.returncode == 0, equal.stdout + equal.stderr


HANGS = """
import os, time
import torch

rank = int(os.environ["RANK"])
model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
model[0].register_forward_hook(lambda m, a, o: None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(1, 2)).sum().backward()
    if rank == 1 and step == 1:
        time.sleep(600)  # hangs inside the window
    opt.step()
"""


@pytest.mark.slow
def test_exec_nproc_timeout_stops_a_hanging_rank_and_keeps_its_partial_trace(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    out = tmp_path / "h.json"
    done = _exec_nproc(tmp_path, "--timeout", "20", "--steps", "3", "-o", str(out), str(script))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 1: hung" in done.stdout and "--timeout 20" in done.stdout
    assert "rank 0: ok" in done.stdout
    partial = hooktrace.load(tmp_path / "h.rank1.json")  # written when it was stopped
    assert partial.meta.rank == 1
    assert [e.step for e in partial.hook_events()] == [0, 1]  # steps 0 and 1's forward hook, then stopped
    assert len(list(hooktrace.load(tmp_path / "h.rank0.json").hook_events())) == 3
