"""`hooktrace run --nproc N` and `hooktrace exec --nproc N`: N ranks supervised through PyTorch's
elastic launcher API, whatever driver the job names (a factory, or a script as torchrun runs it).

`torch.distributed.elastic.multiprocessing.start_processes` starts `python -m hooktrace.ranks JOB`
once per rank, each in its own session, with the environment torchrun gives its workers (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT of a TCPStore this process hosts, as torch's agent
does with TORCHELASTIC_USE_AGENT_STORE) and an elastic error file per rank (the worker's `@record`
writes its exception and traceback there). The ranks are polled: as soon as one fails, the others
are stopped (PyTorch's all-or-nothing policy, applied here so that a rank hooktrace stopped is told
from one a signal killed: the OOM killer's SIGKILL, someone's SIGTERM). On top of that:

- `--timeout S` (see `run_ranks`): a rank that stops making progress, or outlives another by S
  seconds, is stopped with every other rank, and reported `hung`;
- SIGINT / SIGTERM / SIGHUP / SIGQUIT to this process (our handlers raise `runs.stop.Stopped`) stop
  every rank; each writes its partial trace, and the result says which signal it was.

Then every `PATH.rank{r}.json` is loaded and the ranks' hook orders are compared
(`hooktrace.analysis.ranks.compare_ranks`, pure). torch is imported inside `run_ranks` only.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Union

from ..analysis.ranks import compare_ranks
from ..options import RunOptions, UsageError, check_nproc, check_timeout
from ..runs.stop import Stopped, install, restore
from ..schema import TraceFormatError
from ..target import split_spec
from ..validate import load
from .job import Job, _plain  # noqa: F401  (tests read _plain here)
from .result import (
    DEFAULT_TIMEOUT,
    DIED,
    EXIT_CODES,
    HUNG,
    STOPPED,
    RankOutcome,
    RanksResult,
    rank_trace_path,
)
from .worker import ERROR_KEY, NOTES_KEY, PROGRESS_KEY, SIGNALLED_KEY, STOP_SIGNALS

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.api import SignalException

# Joining the group waits for every rank to import torch and start; a loaded machine needs time.
JOIN_TIMEOUT = 300.0
# After asking the ranks to stop (SIGTERM), how long they get to write their partial traces.
STOP_GRACE = 10
_POLL = 0.1
_WORKER = "hooktrace.ranks"
# What stops the launcher (torch's agent handles the same four); a signal found ignored (nohup) stays so.
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_PHASE_WORDS = {
    "starting": "starting (importing torch)",
    "joining": "joining the process group",
    "loading": "loading the target",
    "running": "running the script (before its first step ended)",
    "writing": "writing its trace",
}


def _signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


def _phase_words(phase: str) -> str:
    return _PHASE_WORDS.get(phase, f"in {phase}")


def _check_target(target: str) -> None:
    """Catch a missing file here, before N processes start only to say so (the ranks check the rest)."""
    where, _name = split_spec(target)
    is_file = where.endswith(".py") or "/" in where or os.sep in where  # as hooktrace.target reads it
    if is_file and not os.path.isfile(where):
        what = "is a folder" if os.path.isdir(where) else "not found"
        raise UsageError(f"file {what}: {os.path.abspath(where)}; give the path to a .py file")


def _identity(path: str) -> Optional[tuple[int, int, int]]:
    """What tells this run's file from an earlier one at the same path (written by rename: new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def run_ranks(
    target: Union[str, Job],
    nproc: int,
    *,
    out: Optional[str] = None,
    options: Union[RunOptions, Mapping[str, Any], None] = None,
    timeout: float = DEFAULT_TIMEOUT,
    show_rank: int = 0,
) -> RanksResult:
    """Run TARGET on `nproc` ranks; one trace per rank, compared.

    `out` is the `-o` path: rank r writes `rank_trace_path(out, r)` (`run.json` -> `run.rank0.json`,
    `run.json.gz` -> `run.rank0.json.gz`), each atomically; earlier files at those paths stay as
    they were until a rank replaces its own. Without `out` the traces are read and not kept.
    `options`: the single-process run options, passed unchanged to `hooktrace.runs.factory.run` on
    every rank (a mapping or a dataclass of its keyword arguments).

    `timeout` (seconds, > 0): the longest any rank may go without progress — progress being the
    rank reaching its next stage (loading the target, each step, writing its trace, ending; the
    worker reports them in the launcher's store) — and the longest a rank may still run after
    another rank has ended. Joining the process group may take max(timeout, 300 s).
    Past it, every rank is stopped (SIGTERM, SIGKILL after 10 s) and writes its partial trace.

    Raises UsageError for bad arguments; every rank's failure is reported in the result instead.
    SIGINT / SIGTERM / SIGHUP / SIGQUIT stop every rank and are reported in `RanksResult.interrupted`.
    """
    check_nproc(nproc)
    if not 0 <= show_rank < nproc:
        raise UsageError(f"--rank {show_rank}: give a rank from 0 to {nproc - 1} (--nproc {nproc})")
    check_timeout(timeout)
    job_of = target if isinstance(target, Job) else Job("factory", target=target, options=options)
    if job_of.target:
        _check_target(job_of.target)
    if out is not None:
        folder = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(folder):
            raise UsageError(f"cannot write {out}: folder {folder} does not exist; create it first")
    join_timeout = max(timeout, JOIN_TIMEOUT)
    # the ranks end when this process does (SIGKILL included): the thread that starts them lives as long
    main = threading.current_thread() is threading.main_thread()
    job = dict(job_of.data(), join_timeout=join_timeout, launcher=os.getpid() if main else None)
    watch = _Watch(nproc, timeout, join_timeout)
    ranks: list[RankOutcome] = []
    with _signals_raise() as seen:
        run_dir = _run_dir()
        try:
            job["out"] = prefix = (
                os.path.abspath(out) if out is not None else os.path.join(run_dir, "trace.json")
            )
            paths = [rank_trace_path(prefix, r) for r in range(nproc)]
            before = [_identity(p) for p in paths]
            watch.launch(job, run_dir)
            for r in range(nproc):  # a signal while reading ends the reading: the rest stay unread
                ranks.append(watch.outcome(r, paths[r], before[r], out is not None))
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    traces = {o.rank: o.trace for o in ranks if o.trace is not None}
    return RanksResult(
        nproc=nproc,
        show_rank=show_rank,
        ranks=ranks,
        comparisons=compare_ranks(traces),
        timeout=timeout,
        timed_out=watch.timed_out,
        interrupted=watch.interrupted or seen.get("signal"),
    )


def _run_dir() -> str:
    """A temporary folder for the ranks' logs and error files (removed at the end)."""
    try:
        return tempfile.mkdtemp(prefix="hooktrace-run-")
    except OSError as exc:  # tempfile finds no folder it can write a file in (`ulimit -f 0`, full disk)
        why = f"{exc.strerror or exc}"
        try:
            import resource

            soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        except (ImportError, OSError, ValueError):  # no such limit here (Windows)
            soft = -1
        if soft >= 0 and soft != getattr(resource, "RLIM_INFINITY", -1):
            why += f" (a file-size limit of {soft} bytes is in force, see ulimit -f)"
        raise UsageError(f"cannot create a temporary folder for the ranks' logs: {why}") from exc


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Stopped(signum, f"hooktrace got {signal.Signals(signum).name}")


def _stop_signals() -> tuple[type[Union[Stopped, SignalException]], ...]:
    """What a stop signal raises here: ours, and torch's once its handlers can be installed (the
    PContext's own handlers raise torch's SignalException)."""
    elastic = sys.modules.get("torch.distributed.elastic.multiprocessing.api")
    return (Stopped,) if elastic is None else (Stopped, elastic.SignalException)


def _signum(exc: BaseException) -> int:
    """The signal behind what `_stop_signals()` raised."""
    sig = exc.signal if isinstance(exc, Stopped) else getattr(exc, "sigval", None)
    return int(sig) if sig is not None else int(signal.SIGTERM)


@contextlib.contextmanager
def _failures_but_stops() -> Iterator[None]:
    """`contextlib.suppress(Exception)`, except for what a stop signal raises (torch's SignalException
    is an Exception too): that goes on to the launch, or the ranks would run on."""
    try:
        yield
    except _stop_signals():
        raise
    except Exception:
        pass


@contextlib.contextmanager
def _signals_raise() -> Iterator[dict[str, int]]:
    """While ranks may run, SIGINT/SIGTERM/SIGHUP/SIGQUIT raise (installed before torch is imported); the
    handlers found are restored afterwards. A signal that arrives outside the launch (while the
    traces are read) is recorded in the yielded dict and ends the reading."""
    saved = install(_SIGNALS, _raise_interrupted)  # an ignored one (nohup) stays so
    seen: dict[str, int] = {}
    elastic = logging.getLogger("torch.distributed.elastic")
    quiet = logging.NullHandler()  # its warnings ("Sending process ... closing signal") are ours to say
    elastic.addHandler(quiet)
    propagate, elastic.propagate = elastic.propagate, False  # torch's own handler sits on "torch"
    try:
        yield seen
    except _stop_signals() as exc:
        seen["signal"] = _signum(exc)
    finally:
        elastic.propagate = propagate
        elastic.removeHandler(quiet)
        restore(saved)


def _rank_env(rank: int, nproc: int, port: int, run_id: str) -> dict[str, str]:
    """What torchrun's agent sets for one worker on one node (the store is ours: agent store)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(nproc),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),  # torchrun's default, without its banner
        "PYTHONUNBUFFERED": "1",
    }


class _Watch:
    """One launch: start the ranks, follow their progress, stop them on failure, timeout or signal."""

    def __init__(self, nproc: int, timeout: float, join_timeout: float) -> None:
        self.nproc = nproc
        self.timeout = timeout
        self.join_timeout = join_timeout
        self.phase: dict[int, str] = {}
        self.since: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.hung: dict[int, str] = {}
        self.timed_out: Optional[str] = None
        self.interrupted: Optional[int] = None
        # The ranks still running when hooktrace stopped them (another rank failed, timeout, signal)
        # and the signal sent: what ended them is ours, not their own failure.
        self.stopped: set[int] = set()
        self.stop_signal: Optional[signal.Signals] = None
        self.stop_sent_at = 0.0  # time.time() when hooktrace sent its stop signal
        self.pc: Any = None
        self.store: Any = None

    def launch(self, job: dict[str, Any], run_dir: str) -> None:
        wait = datetime.timedelta(seconds=self.join_timeout)
        run_id = uuid.uuid4().hex
        self.since = dict.fromkeys(range(self.nproc), time.monotonic())
        try:
            from torch.distributed import TCPStore
            from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes

            from ..runs.driver import driver_class

            # a script's own output reaches the terminal (and the log the launcher reads); a factory's is kept
            tee = Std.ALL if driver_class(job["driver"]).own_output else Std.NONE
            main = threading.current_thread() is threading.main_thread()
            ours = (
                {sig: signal.getsignal(sig) for sig in _SIGNALS} if main else {}
            )  # the PContext sets its own
            self.store = TCPStore("127.0.0.1", 0, None, is_master=True, timeout=wait, wait_for_workers=False)
            self.pc = start_processes(
                name="hooktrace",
                entrypoint=sys.executable,
                args={r: ("-m", _WORKER, json.dumps(job)) for r in range(self.nproc)},
                envs={r: _rank_env(r, self.nproc, self.store.port, run_id) for r in range(self.nproc)},
                logs_specs=DefaultLogsSpecs(
                    log_dir=os.path.join(run_dir, "logs"), redirects=Std.ALL, tee=tee
                ),
            )
            restore(ours)  # ours raise as torch's do; an ignored signal stays so
            while not self._done():
                time.sleep(_POLL)
        except _stop_signals() as exc:
            self.interrupted = got = _signum(exc)
            # The ranks keep their partial traces on the signals they handle; for others, SIGTERM.
            self._stop(signal.Signals(got) if got in STOP_SIGNALS else signal.SIGTERM)
        now = time.monotonic()
        for r in range(self.nproc):
            self.ended.setdefault(r, now)

    def _done(self) -> bool:
        now = time.monotonic()
        failed = False
        for r, handler in self.pc.subprocess_handlers.items():
            code = handler.proc.poll()
            if code is not None:
                self.ended.setdefault(r, now)
                failed = failed or code != 0
            phase = self._read(PROGRESS_KEY.format(rank=r))
            if phase is not None and phase != self.phase.get(r):
                self.phase[r], self.since[r] = phase, now
        if len(self.ended) == self.nproc:
            self.pc.close()  # nothing left to stop: closes the PContext's log files
            return True
        if failed:  # PyTorch's all-or-nothing policy, applied here so we know who was stopped
            self._stop(signal.SIGTERM)
            return True
        self.hung = self._overdue(now)
        if not self.hung:
            return False
        self.timed_out = "; ".join(f"rank {r} {why}" for r, why in self.hung.items())
        self._stop(signal.SIGTERM)
        return True

    def _overdue(self, now: float) -> dict[int, str]:
        """Running ranks past --timeout: without progress for too long, or outliving an ended rank."""
        first_end = min(self.ended.items(), key=lambda item: item[1], default=None)
        overdue = {}
        for r in range(self.nproc):
            if r in self.ended:
                continue
            phase = self.phase.get(r, "starting")
            limit = self.join_timeout if phase in ("starting", "joining") else self.timeout
            if now - self.since[r] > limit:
                overdue[r] = f"made no progress for {limit:g}s while {_phase_words(phase)}"
            elif first_end is not None and now - first_end[1] > self.timeout:
                overdue[r] = (
                    f"still ran {self.timeout:g}s after rank {first_end[0]} ended ({_phase_words(phase)})"
                )
        return overdue

    def _stop(self, sig: signal.Signals) -> None:
        """Stop every rank: `sig` to each rank's process group, SIGKILL after STOP_GRACE seconds."""
        if self.pc is None:
            return
        if self.stop_signal is None:
            self.stop_signal, self.stop_sent_at = sig, time.time()
            handlers = self.pc.subprocess_handlers.items()
            self.stopped = {r for r, h in handlers if r not in self.ended and h.proc.poll() is None}
        try:
            self.pc.close(death_sig=sig, timeout=STOP_GRACE)
        except _stop_signals() as exc:  # asked again while waiting: no more grace
            self.interrupted = self.interrupted or _signum(exc)
            self.pc.close(death_sig=signal.SIGKILL, timeout=STOP_GRACE)

    def _read(self, key: str) -> Optional[str]:
        """A rank's report, or None when the store cannot say; a stop signal that arrives meanwhile
        is not the store's failure: it goes on to the launch (swallowed, the ranks ran on)."""
        with _failures_but_stops():
            if self.store.check([key]):
                return self.store.get(key).decode("utf-8", "replace")
        return None

    def outcome(
        self, rank: int, path: str, before: Optional[tuple[int, int, int]], keep: bool
    ) -> RankOutcome:
        """Rank `rank`'s state from its exit code and error file, and the trace it wrote in this run."""
        proc = self.pc.subprocess_handlers[rank].proc if self.pc is not None else None
        code = proc.poll() if proc is not None else None
        outcome = RankOutcome(
            rank=rank, state=DIED if code is None else EXIT_CODES.get(code, DIED), exitcode=code
        )
        outcome.ended_at = self.ended.get(rank)
        if proc is None:
            outcome.error = "never started (the launch was interrupted)"
        elif code:
            self._read_error_file(outcome, proc.pid, code)
        notes = self._read(NOTES_KEY.format(rank=rank))
        outcome.notes = list(json.loads(notes)) if notes else []
        if rank in self.hung:
            outcome.state = HUNG
            why = f"{self.hung[rank]} (--timeout {self.timeout:g})"
            outcome.error = f"{why}; stopped in: {outcome.error}" if outcome.error else why
        if _identity(path) not in (None, before):
            try:
                outcome.trace = load(path)
            except (OSError, TraceFormatError) as exc:
                unreadable = f"its trace is unreadable: {exc}"
                outcome.error = f"{outcome.error}; {unreadable}" if outcome.error else unreadable
            outcome.trace_path = path if keep else None
        return outcome

    def _read_error_file(self, outcome: RankOutcome, pid: int, exitcode: int) -> None:
        from torch.distributed.elastic.multiprocessing import ProcessFailure

        failure: Any = None
        with _failures_but_stops():
            failure = ProcessFailure(outcome.rank, pid, exitcode, self.pc.error_files[outcome.rank])
        message = failure.message if failure is not None else None
        said = self._read(ERROR_KEY.format(rank=outcome.rank))  # the same error, kept in memory
        if isinstance(message, dict) or said is not None:
            # no readable error file (a file-size limit, a full disk): what the rank put in the store
            text = str(message.get("message", "")) if isinstance(message, dict) else str(said)
            for prefix in ("RankFailed: ", "UsageError: ", "Stopped: "):
                text = text.removeprefix(prefix)
            outcome.error = text
            if isinstance(message, dict):
                outcome.traceback = message.get("extraInfo", {}).get("py_callstack")
            self._stopped_from_outside(outcome)
            return
        code = outcome.exitcode
        if outcome.state == STOPPED:
            outcome.error = "stopped before it began tracing"
            self._stopped_from_outside(outcome)
            return
        if code is None:
            outcome.error = "the rank's process did not end, even after SIGKILL"
            return
        if code < 0 and outcome.rank in self.stopped and -code in (self.stop_signal, signal.SIGKILL):
            # ours: it ended before its handler was in place, or did not end within the grace
            outcome.state, outcome.error = STOPPED, f"stopped by {_signal_name(-code)}"
            return
        if code < 0:
            outcome.error = f"the rank's process died from {_signal_name(-code)}"
        else:
            outcome.error = f"the rank's process exited with code {code} without a word"
        said = self._last_words(outcome)
        if said:
            outcome.error += f"; {said}"

    def _stopped_from_outside(self, outcome: RankOutcome) -> None:
        """A rank that stopped on a signal hooktrace did not send (someone else's SIGTERM, SIGINT or
        SIGHUP: it kept its partial trace) died; it was not stopped because another rank failed. A rank
        that was still ending when hooktrace stopped the others (its own signal closed its process group,
        so the others failed first) says which signal stopped it: not the one hooktrace sent, not ours."""
        sent = self.stop_signal.name if self.stop_signal is not None else None
        said = (outcome.error or "").startswith("stopped by ")
        foreign = said and sent is not None and not (outcome.error or "").startswith(f"stopped by {sent}")
        if said and not foreign and sent is not None:  # the same signal: whose came first?
            at = self._read(SIGNALLED_KEY.format(rank=outcome.rank))
            try:
                foreign = at is not None and float(at) < self.stop_sent_at
            except ValueError:
                pass
        if outcome.state == STOPPED and (outcome.rank not in self.stopped or foreign):
            outcome.state = DIED
            outcome.error = f"{outcome.error} (a signal hooktrace did not send)"

    def _last_words(self, outcome: RankOutcome) -> str:
        """What a rank that ended without an error file left on stderr: faulthandler's dump (kept as
        its traceback; the fatal error and the innermost frame are quoted), else its last line."""
        try:
            with open(self.pc.stderrs[outcome.rank], encoding="utf-8", errors="replace") as fh:
                text = fh.read()[-20000:]
        except (OSError, KeyError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")]
        if fatal:
            dump = lines[fatal[-1] :]
            outcome.traceback = "\n".join(dump)
            frames = [line for line in dump if line.startswith("File ")]
            return f"{dump[0]}" + (f", in {frames[0]}" if frames else "")
        return f"its last words: {lines[-1]}" if lines else ""
