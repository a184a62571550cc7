"""`hooktrace run --nproc N`: N ranks through PyTorch's launcher, one trace per rank, and where they diverge.

Two sides in one module:

- the parent (`run_ranks`) starts ``python -m torch.distributed.run --standalone --nnodes=1
  --nproc-per-node=N -m hooktrace.ranks ...``, watches the ranks through small status files, stops
  them all when one crashes or hangs (``timeout``), then loads every ``PATH.rank{r}.json`` and
  compares the ranks' hook orders (`hooktrace.analysis.ranks.compare_ranks`, pure);
- the worker (``python -m hooktrace.ranks``, `worker_main`) reads RANK / WORLD_SIZE / LOCAL_RANK,
  initialises the default process group (gloo on CPU, nccl for CUDA tensors), runs the ordinary
  single-process driver `hooktrace.capture.run.run` and writes its trace with `meta.rank` and
  `meta.world_size`.

torch is imported only on the worker side, inside functions: the parent and the comparison never
import it, so they stay as fast as `hooktrace diff`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

from ..analysis.ranks import RankComparison, compare_ranks
from ..schema import Trace, TraceFormatError, load
from ..target import UsageError, split_spec

DEFAULT_TIMEOUT = 60.0
# Joining the group waits for every rank to import torch and the target; a loaded machine needs time.
_RENDEZVOUS_TIMEOUT = 300.0
# After asking the ranks to stop (SIGTERM), how long they get to write their partial traces.
_STOP_GRACE = 10.0
_POLL = 0.1
# Once every rank has reported, how long the launcher gets to shut down by itself.
_LAUNCHER_GRACE = 3.0
# What a collective raises when the peer process died or never came (gloo; NCCL's watchdog says timed out).
_PEER_ERRORS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
    "timed out",
)
_WORKER_MODULE = "hooktrace.ranks"

# Rank states, as reported in RanksResult (the worker writes the first five itself).
OK, FAILED, STOPPED, USAGE, CRASHED = "ok", "failed", "stopped", "usage", "crashed"
HUNG, DIED = "hung", "died"  # decided by the parent: killed after --timeout / ended without a word
_FINISHED = {OK, FAILED, STOPPED, USAGE, CRASHED}


# -- paths ------------------------------------------------------------------------------------------


def rank_trace_path(out: str, rank: int) -> str:
    """`run.json` -> `run.rank0.json`; another extension is replaced too (`run.svg` -> `run.rank0.json`)."""
    stem, ext = os.path.splitext(out)
    if not ext or os.sep in ext or (os.altsep and os.altsep in ext):
        stem = out
    return f"{stem}.rank{rank}.json"


def run_options(
    *,
    steps: int = 1,
    backward: bool = True,
    input_shapes: Sequence[str] = (),
    dtype: Optional[str] = None,
    device: Optional[str] = None,
) -> list[str]:
    """The single-process run options as worker arguments (the `worker_args` of `run_ranks`)."""
    args = ["--steps", str(steps)]
    if not backward:
        args.append("--no-backward")
    for shape in input_shapes:
        args += ["--input", shape]
    if dtype is not None:
        args += ["--dtype", dtype]
    if device is not None:
        args += ["--device", device]
    return args


# -- the result of a multi-rank run ---------------------------------------------------------------


@dataclass
class RankOutcome:
    """What one rank did: its state, its error (if any) and the trace it wrote (possibly partial)."""

    rank: int
    state: str  # ok | failed | stopped | usage | crashed | hung | died
    error: Optional[str] = None
    trace_path: Optional[str] = None
    trace: Optional[Trace] = None
    notes: list[str] = field(default_factory=list)
    exitcode: Optional[int] = None
    traceback: Optional[str] = None
    finished_at: Optional[float] = None  # wall-clock time the rank reported its end

    @property
    def waited_on_peer(self) -> bool:
        """Failed in a collective because another rank died or did not come (a consequence, not a cause)."""
        return self.state == FAILED and any(p in (self.error or "") for p in _PEER_ERRORS)

    def describe(self) -> str:
        written = f" -> {self.trace_path}" if self.trace is not None else " (no trace written)"
        size = ""
        if self.trace is not None:
            size = f", {len(self.trace.hooks)} hooks, {sum(1 for _ in self.trace.hook_events())} hook events"
        partial = " (partial)" if self.trace is not None and self.state != OK else ""
        head = f"rank {self.rank}: {self.state}{size}{written}{partial}"
        return f"{head}\n  {self.error}" if self.error else head


@dataclass
class RanksResult:
    """Every rank's outcome and the comparison of their hook orders. `exit_code`: 0 agree, 1 not, 2 usage."""

    nproc: int
    show_rank: int
    ranks: list[RankOutcome]
    comparisons: list[RankComparison]
    timed_out: bool = False
    timeout: float = DEFAULT_TIMEOUT
    launcher_exitcode: Optional[int] = None
    launcher_output: str = ""
    trace_dir: Optional[str] = None

    @property
    def shown(self) -> Optional[Trace]:
        """The trace of `show_rank` (None when that rank wrote nothing)."""
        return self.ranks[self.show_rank].trace if self.show_rank < len(self.ranks) else None

    @property
    def trace_paths(self) -> list[str]:
        return [o.trace_path for o in self.ranks if o.trace is not None and o.trace_path]

    @property
    def failed(self) -> list[RankOutcome]:
        return [o for o in self.ranks if o.state != OK]

    @property
    def first_failure(self) -> Optional[RankOutcome]:
        """The rank that caused the failure: the first to fail on its own, else the one the others waited on."""
        if not self.failed:
            return None
        own = [o for o in self.failed if o.state not in (STOPPED, HUNG) and not o.waited_on_peer]
        stuck = [o for o in self.failed if o.state in (STOPPED, HUNG)]
        if not own and stuck and any(o.waited_on_peer for o in self.failed):
            own = stuck  # the others timed out in a collective this rank never reached
        return min(own or self.failed, key=lambda o: (o.finished_at is None, o.finished_at or 0.0, o.rank))

    @property
    def diverged(self) -> bool:
        return any(not c.agree for c in self.comparisons)

    @property
    def usage_error(self) -> Optional[str]:
        """The bad-usage message when every rank stopped on it before running (exit 2)."""
        errors = {o.error for o in self.ranks if o.state == USAGE}
        if len(errors) == 1 and all(o.state in (USAGE, STOPPED, DIED) for o in self.ranks):
            return errors.pop()
        return None

    @property
    def exit_code(self) -> int:
        if self.usage_error is not None:
            return 2
        return 1 if self.failed or self.diverged or len(self.ranks) != self.nproc else 0

    def summary(self) -> str:
        """The per-rank agreement summary printed under the tree of `show_rank`."""
        lines = [f"{self.nproc} ranks (showing rank {self.show_rank}):"]
        lines += ["  " + o.describe().replace("\n", "\n  ") for o in self.ranks]
        notes: dict[str, list[int]] = {}
        for o in self.ranks:
            for note in o.notes:
                notes.setdefault(note, []).append(o.rank)
        for note, on in notes.items():
            where = "every rank" if len(on) == len(self.ranks) else ", ".join(f"rank {r}" for r in on)
            lines.append(f"note ({where}): {note}")
        if self.timed_out:
            lines.append(f"stopped every rank: one still ran {self.timeout:g}s after another had stopped")
        if self.failed:
            names = ", ".join(f"rank {o.rank} {o.state}" for o in self.failed)
            lines.append(f"ranks failed: {names}")
            first = self.first_failure
            if first is not None and len(self.failed) > 1:
                if first.state in (STOPPED, HUNG):
                    lines.append(
                        f"rank {first.rank} held the others up: they timed out waiting for it; it was in"
                    )
                    lines.append(f"  {first.error}")
                else:
                    lines.append(f"first to fail: rank {first.rank} ({first.state}): {first.error}")
        present = [o.rank for o in self.ranks if o.trace is not None]
        if self.nproc == 1:
            lines.append("one rank: no other hook order to compare with")
        elif len(present) < 2:
            lines.append("hook orders not compared: fewer than two ranks wrote a trace")
        elif not self.diverged:
            events = self.comparisons[0].events[0] if self.comparisons else 0
            ranks = ", ".join(str(r) for r in present)
            lines.append(f"ranks agree: same hook order on ranks {ranks} ({events} hook events each)")
        else:
            bad = [c for c in self.comparisons if not c.agree]
            lines.append(
                "ranks diverge: " + ", ".join(f"rank {c.rank} differs from rank {c.reference}" for c in bad)
            )
            states = {o.rank: o.state for o in self.ranks}
            for c in bad:
                partial = states.get(c.rank) != OK or states.get(c.reference) != OK
                lines.append(c.describe(partial=partial))
        if len(self.trace_paths) >= 2:
            lines.append(f"compare two ranks: hooktrace diff {self.trace_paths[0]} {self.trace_paths[1]}")
        return "\n".join(lines)


# -- the parent: launch, watch, stop, collect -----------------------------------------------------


def _launcher_command(nproc: int, worker: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "-m",
        _WORKER_MODULE,
        *worker,
    ]


def _status_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}.status.json")


def _read_status(run_dir: str, rank: int) -> Optional[dict[str, Any]]:
    try:
        with open(_status_path(run_dir, rank), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_our_worker(pid: int) -> bool:
    """True while `pid` is still a hooktrace rank (guards against a recycled pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return _WORKER_MODULE.encode() in fh.read()
    except OSError:
        return sys.platform != "linux" and _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _signal_workers(statuses: dict[int, dict[str, Any]], sig: int) -> None:
    for status in statuses.values():
        pid = status.get("pid")
        if isinstance(pid, int) and status.get("state") == "running" and _is_our_worker(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def _stop(proc: subprocess.Popen, run_dir: str, nproc: int) -> None:
    """Ask the launcher and every rank to stop (they write partial traces), then kill what is left."""
    statuses = _statuses(run_dir, nproc)
    _signal_workers(statuses, signal.SIGTERM)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE
    while time.monotonic() < deadline:
        statuses = _statuses(run_dir, nproc)
        running = [s for s in statuses.values() if s.get("state") == "running"]
        if proc.poll() is not None and not running:
            return
        time.sleep(_POLL)
    # Ranks run in their own sessions (the launcher starts them so): kill each rank's group too.
    for status in _statuses(run_dir, nproc).values():
        pid = status.get("pid")
        if isinstance(pid, int) and status.get("state") == "running" and _is_our_worker(pid):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_GRACE)


def _statuses(run_dir: str, nproc: int) -> dict[int, dict[str, Any]]:
    found = {}
    for rank in range(nproc):
        status = _read_status(run_dir, rank)
        if status is not None:
            found[rank] = status
    return found


_EXITCODE_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def _launcher_exitcodes(output: str) -> dict[int, int]:
    """Exit codes per rank from torch.distributed.run's failure report (empty when it printed none)."""
    return {int(r): int(code) for r, code in _EXITCODE_RE.findall(output)}


def _signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"signal {-code}"


def _collect(
    rank: int,
    status: Optional[dict[str, Any]],
    trace_path: str,
    timed_out: bool,
    exitcodes: dict[int, int],
    launcher_tail: str,
) -> RankOutcome:
    outcome = RankOutcome(rank=rank, state=DIED, trace_path=trace_path, exitcode=exitcodes.get(rank))
    if status is not None:
        outcome.state = status.get("state", DIED)
        outcome.error = status.get("error")
        outcome.notes = list(status.get("notes") or [])
        outcome.traceback = status.get("traceback")
        outcome.finished_at = status.get("finished_at")
        if outcome.state == "running":
            outcome.state = DIED
    if outcome.state == STOPPED and timed_out and status is not None and status.get("hung"):
        outcome.state = HUNG
    if outcome.state == DIED:
        if timed_out:
            outcome.state = HUNG
            outcome.error = "did not finish within --timeout and had to be killed"
            if status is None:
                outcome.error = f"never started; the launcher said: {launcher_tail or 'nothing'}"
        elif outcome.exitcode is not None and outcome.exitcode < 0:
            outcome.error = f"the rank's process died from {_signal_name(outcome.exitcode)}"
        elif outcome.exitcode is not None:
            outcome.error = f"the rank's process exited with code {outcome.exitcode} before it reported"
        elif status is None and launcher_tail:
            outcome.error = f"the rank never started; the launcher said: {launcher_tail}"
        else:
            outcome.error = "the rank's process ended before finishing its trace"
    if os.path.exists(trace_path):
        try:
            outcome.trace = load(trace_path)
        except (OSError, TraceFormatError) as exc:
            unreadable = f"its trace is unreadable: {exc}"
            outcome.error = f"{outcome.error}; {unreadable}" if outcome.error else unreadable
    return outcome


def _tail(text: str, lines: int = 1) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def _check_target(target: str) -> None:
    """Catch a missing file here, before N processes start only to say so (the ranks check the rest)."""
    where, _name = split_spec(target)
    is_file = where.endswith(".py") or "/" in where or os.sep in where  # as hooktrace.target reads it
    if is_file and not os.path.isfile(where):
        what = "is a folder" if os.path.isdir(where) else "not found"
        raise UsageError(f"file {what}: {os.path.abspath(where)}; give the path to a .py file")


def run_ranks(
    target: str,
    nproc: int,
    *,
    out: Optional[str] = None,
    worker_args: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
    show_rank: int = 0,
) -> RanksResult:
    """Run TARGET on `nproc` ranks through `torch.distributed.run`; one trace per rank, compared.

    `out` is the `-o` path: rank r writes `rank_trace_path(out, r)` (`run.json` -> `run.rank0.json`);
    without it the traces go to a new temporary folder (kept, so `hooktrace diff` can read them).
    `worker_args` are the single-process run options (see `run_options`). `timeout` bounds how long
    a rank waits for a collective and how long the others may run on after one rank has stopped.
    Raises UsageError for bad arguments; every rank's failure is reported in the result instead.
    """
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: give at least 1")
    if not 0 <= show_rank < nproc:
        raise UsageError(f"--rank {show_rank}: give a rank from 0 to {nproc - 1} (--nproc {nproc})")
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout:g}: give a positive number of seconds")
    _check_target(target)
    if out is not None:
        folder = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(folder):
            raise UsageError(f"cannot write {out}: folder {folder} does not exist; create it first")
        prefix = os.path.abspath(out)
        trace_dir = None
    else:
        trace_dir = tempfile.mkdtemp(prefix="hooktrace-ranks-")
        prefix = os.path.join(trace_dir, "trace.json")
    run_dir = tempfile.mkdtemp(prefix="hooktrace-run-")
    try:
        return _run(target, nproc, prefix, run_dir, list(worker_args), timeout, show_rank, trace_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _run(
    target: str,
    nproc: int,
    prefix: str,
    run_dir: str,
    worker_args: list[str],
    timeout: float,
    show_rank: int,
    trace_dir: Optional[str],
) -> RanksResult:
    paths = [rank_trace_path(prefix, r) for r in range(nproc)]
    for path in paths:  # a stale trace from an earlier run must not pass for this run's
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    worker = [target, "--run-dir", run_dir, "--out", prefix, "--timeout", repr(float(timeout)), *worker_args]
    env = dict(os.environ)
    env["MASTER_ADDR"] = "127.0.0.1"
    env.setdefault("OMP_NUM_THREADS", "1")  # what the launcher would set, without its banner
    env["PYTHONUNBUFFERED"] = "1"
    log_path = os.path.join(run_dir, "launcher.log")
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _launcher_command(nproc, worker),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, so it can be stopped as a whole
        )
        try:
            timed_out = _watch(proc, run_dir, nproc, timeout)
        except BaseException:  # Ctrl-C in the parent: leave no rank behind
            _stop(proc, run_dir, nproc)
            raise
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        output = fh.read()
    statuses = _statuses(run_dir, nproc)
    exitcodes = _launcher_exitcodes(output)
    tail = _tail(output)
    ranks = [_collect(r, statuses.get(r), paths[r], timed_out, exitcodes, tail) for r in range(nproc)]
    traces = {o.rank: o.trace for o in ranks if o.trace is not None}
    return RanksResult(
        nproc=nproc,
        show_rank=show_rank,
        ranks=ranks,
        comparisons=compare_ranks(traces),
        timed_out=timed_out,
        timeout=timeout,
        launcher_exitcode=proc.returncode,
        launcher_output=output,
        trace_dir=trace_dir,
    )


def _watch(proc: subprocess.Popen, run_dir: str, nproc: int, timeout: float) -> bool:
    """Wait for the launcher; True when a rank outlived the others by `timeout` and all were stopped."""
    started = time.monotonic()
    first_done: Optional[float] = None
    all_done: Optional[float] = None
    while proc.poll() is None:
        statuses = _statuses(run_dir, nproc)
        if len(statuses) < nproc and time.monotonic() - started > max(timeout, _RENDEZVOUS_TIMEOUT):
            _stop(proc, run_dir, nproc)  # some rank never started: the launcher is stuck
            return True
        done = [s for s in statuses.values() if s.get("state") in _FINISHED]
        if first_done is None and done:
            first_done = time.monotonic()
        if all_done is None and len(done) == nproc:
            all_done = time.monotonic()
        if all_done is not None and time.monotonic() - all_done > _LAUNCHER_GRACE:
            _stop(proc, run_dir, nproc)  # every rank reported and wrote its trace: no need to wait longer
            return False
        if first_done is not None and time.monotonic() - first_done > timeout:
            for rank, status in statuses.items():
                if status.get("state") == "running":
                    _mark_hung(run_dir, rank)
            _stop(proc, run_dir, nproc)
            return True
        time.sleep(_POLL)
    return False


def _hung(run_dir: str, rank: int) -> bool:
    return os.path.exists(os.path.join(run_dir, f"rank{rank}.hung"))


def _mark_hung(run_dir: str, rank: int) -> None:
    """Tell a rank (through its status file) that it is being stopped for hanging, not for a peer."""
    with contextlib.suppress(OSError):
        with open(os.path.join(run_dir, f"rank{rank}.hung"), "w"):
            pass


# -- the worker: one rank --------------------------------------------------------------------------


class RankTerminated(Exception):
    """The launcher (or hooktrace) stopped this rank; raised from the signal handler so the trace is kept."""


class _Status:
    """The rank's status file: `running` with its pid first, then how it ended. Written atomically."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.path = _status_path(run_dir, rank)
        self.data: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "state": "running"}

    def write(self, **fields: Any) -> None:
        self.data.update(fields)
        if self.data["state"] != "running":
            self.data["hung"] = _hung(self.run_dir, self.rank)
            self.data["finished_at"] = time.time()
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.data, fh)
        os.replace(tmp, self.path)


def _worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hooktrace.ranks", description="One hooktrace rank.")
    p.add_argument("target")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True, help="rank r writes rank_trace_path(OUT, r)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--dtype")
    p.add_argument("--device")
    return p


def _env_int(name: str, default: Optional[int] = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"{name} is not set: run ranks through hooktrace run --nproc N")
        return default
    return int(value)


def _rank_device(device: Optional[str], local_rank: int) -> tuple[Optional[str], bool]:
    """The `--device` this rank uses and whether it uses CUDA (each rank on its own GPU)."""
    import torch

    cuda = torch.cuda.is_available()
    name = (device or "").strip().lower()
    if name in ("cuda", "auto") and cuda:
        return f"cuda:{local_rank}", True
    if not cuda or name == "cpu":
        return device, False  # `--device cuda` without CUDA: the run reports it as a usage error
    return device, True


@contextlib.contextmanager
def _factory_may_init(dist: Any) -> Iterator[None]:
    """A factory that calls `init_process_group` itself finds the group hooktrace made and keeps it."""
    from torch.distributed import distributed_c10d

    real = distributed_c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized():
            return None
        return real(*args, **kwargs)

    init_process_group.__wrapped__ = real  # type: ignore[attr-defined]
    init_process_group.__doc__ = real.__doc__
    saved = (dist.init_process_group, distributed_c10d.init_process_group)
    dist.init_process_group = distributed_c10d.init_process_group = init_process_group
    try:
        yield
    finally:
        dist.init_process_group, distributed_c10d.init_process_group = saved


_WORKER_RUN_DIR: dict[str, Any] = {}  # run dir and rank of this worker, for the signal handler


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: let the rank write its trace
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name = signal.Signals(signum).name
    if _WORKER_RUN_DIR and _hung(_WORKER_RUN_DIR["run_dir"], _WORKER_RUN_DIR["rank"]):
        raise RankTerminated(f"stopped by {name} (still running --timeout seconds after another rank ended)")
    raise RankTerminated(f"stopped by {name} (the launcher stops every rank when one fails)")


def _terminated(exc: Optional[BaseException]) -> bool:
    while exc is not None:
        if isinstance(exc, RankTerminated):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def worker_main(argv: Optional[Sequence[str]] = None) -> int:
    """One rank: init the process group, trace the target, write `PATH.rank{r}.json` and a status."""
    args = _worker_parser().parse_args(argv)
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", rank)
    status = _Status(args.run_dir, rank)
    status.write()
    _WORKER_RUN_DIR.update(run_dir=args.run_dir, rank=rank)
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, _raise_terminated)
    trace_path = rank_trace_path(args.out, rank)
    dist: Any = None
    try:
        code = _work(args, rank, world_size, local_rank, trace_path, status)
    except UsageError as exc:
        state = STOPPED if _terminated(exc) else USAGE
        status.write(state=state, error=str(exc))
        code = 2 if state == USAGE else 1
    except BaseException as exc:  # a crash outside the model (process group, saving): report it
        state = STOPPED if _terminated(exc) else CRASHED
        status.write(state=state, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # reported: a late stop signal just ends the process
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        dist = sys.modules.get("torch.distributed")
        if dist is not None:
            with contextlib.suppress(Exception):
                if dist.is_initialized():
                    dist.destroy_process_group()
    return code


def _work(
    args: argparse.Namespace, rank: int, world_size: int, local_rank: int, trace_path: str, status: _Status
) -> int:
    import datetime

    import torch.distributed as dist

    from ..capture.run import run
    from ..target import load_factory

    device, cuda = _rank_device(args.device, local_rank)
    if cuda:
        import torch

        torch.cuda.set_device(local_rank)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    join = max(args.timeout, _RENDEZVOUS_TIMEOUT)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=join))
    # Then --timeout bounds every collective: a rank waiting on a dead or hung peer fails, trace kept.
    with contextlib.suppress(AttributeError, RuntimeError, ValueError):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(datetime.timedelta(seconds=args.timeout))
    with _factory_may_init(dist):
        factory = load_factory(args.target)
        result = run(
            factory,
            steps=args.steps,
            backward=not args.no_backward,
            input_shapes=args.input,
            dtype=args.dtype,
            device=device,
        )
    trace = result.trace
    trace.meta.rank = rank
    trace.meta.world_size = world_size
    trace.save(trace_path)
    if result.exception is None:
        status.write(state=OK, notes=result.notes)
        return 0
    state = STOPPED if _terminated(result.exception) else FAILED
    status.write(state=state, error=result.error, notes=result.notes)
    return 1


def _main() -> None:
    try:
        code = worker_main()
    except UsageError as exc:  # started by hand, not by the launcher
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and reported: skip the interpreter's slow teardown of torch (seconds per rank).
    os._exit(code)
