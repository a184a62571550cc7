"""One rank of `run --nproc N` (`python -m hooktrace.ranks JOB`), started by `launch.py`.

The rank reads RANK / WORLD_SIZE / LOCAL_RANK and MASTER_ADDR / MASTER_PORT as PyTorch's launcher
sets them, joins the default process group through the launcher's TCPStore (gloo on CPU, nccl for
CUDA), runs the ordinary single-process driver (`hooktrace.runs.factory.run`, with the run options
the CLI parsed, passed through unchanged) and writes its trace with `meta.rank` / `meta.world_size`.

What it tells the launcher:
- its progress (`joining`, `loading`, `step N`, `writing`) as a key in the launcher's store, so a
  rank that stops making progress can be told from a slow one (`--timeout`);
- how it ended, by its exit code (`result.EXIT_CODES`), and, when it did not succeed, its error
  and traceback in its elastic error file (`@record` writes TORCHELASTIC_ERROR_FILE; when that does
  not fit under a file-size limit, the error alone, or no file), and its error as a key in the
  store too (`ERROR_KEY`: memory, not a file, so a file-size limit cannot lose it);
- the run's notes (e.g. "backward skipped"), as a key in the store.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import json
import os
import signal
import sys
import time
from typing import Any, Iterator, Optional

from ..options import UsageError
from ..runs.driver import LOADING
from ..runs.stop import Stopped, install, restore
from .result import CRASHED, FAILED, OK, STATE_EXIT, STOPPED, USAGE, rank_trace_path

PROGRESS_KEY = "hooktrace/progress/{rank}"
NOTES_KEY = "hooktrace/notes/{rank}"
ERROR_KEY = "hooktrace/error/{rank}"
# when (time.time()) the rank's first stop signal arrived: the launcher tells a signal of its own
# from one someone else sent before it (the same SIGTERM by name)
SIGNALLED_KEY = "hooktrace/signalled/{rank}"
_SIGNALLED_AT: list[float] = []
# An error message longer than this is cut in the store and in the error file without traceback.
_MESSAGE_LIMIT = 4000


# The signals that stop a rank with its partial trace written: what the launcher forwards (it gets
# SIGHUP when its terminal closes) and what an outside `kill` sends.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class RankFailed(Exception):
    """The model or a hook raised; the message names the module, the hook and the exception."""


class _Deferral:
    """Whether a stop signal raises now (before the run, and while the factory and the steps run:
    the partial trace is kept) or waits (once they have ended, while the trace is built and
    written: raising there would lose it). A deferred signal is only remembered; the rank then ends
    as its run did, having written its trace."""

    def __init__(self) -> None:
        self.deferring = False
        self.pending: Optional[int] = None

    def armed(self, running: bool) -> None:
        self.deferring = not running


_DEFERRAL = _Deferral()


def _raise_terminated(signum: int, frame: Any) -> None:
    if not _SIGNALLED_AT:
        _SIGNALLED_AT.append(time.time())
    if _DEFERRAL.deferring:
        if _DEFERRAL.pending is None:
            _DEFERRAL.pending = signum
        return
    install(STOP_SIGNALS, signal.SIG_IGN)  # one is enough: let the rank write its trace
    raise Stopped(signum, f"stopped by {signal.Signals(signum).name}")


def _termination(exc: Optional[BaseException]) -> Optional[Stopped]:
    """The stop signal behind `exc`, if any (a hook or the factory may have wrapped it)."""
    while exc is not None:
        if isinstance(exc, Stopped):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _terminated(exc: Optional[BaseException]) -> bool:
    return _termination(exc) is not None


def _env_int(name: str, default: Optional[int] = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"{name} is not set: run ranks through hooktrace run --nproc N")
        return default
    return int(value)


class _Store:
    """This rank's reports in the launcher's store; a store that went away is not this rank's error."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store = store
        self.rank = rank

    def _set(self, key: str, value: str) -> None:
        try:
            self.store.set(key, value)
        except Exception:  # a stop signal (`Stopped`) is no Exception: it goes on
            pass

    def progress(self, phase: str) -> None:
        self._set(PROGRESS_KEY.format(rank=self.rank), phase)

    def step(self, step: int, warmup: bool = False) -> None:
        self.progress(f"warm-up step {step}" if warmup else f"step {step}")

    def notes(self, notes: list[str]) -> None:
        self._set(NOTES_KEY.format(rank=self.rank), json.dumps(notes))

    def error(self, exc: BaseException) -> None:
        if _SIGNALLED_AT:
            self._set(SIGNALLED_KEY.format(rank=self.rank), repr(_SIGNALLED_AT[0]))
        self._set(ERROR_KEY.format(rank=self.rank), error_message(exc))


def error_message(exc: BaseException) -> str:
    """What the elastic error file says of `exc` (`Type: message`), cut to a bounded length."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 1] + "…"


def _error_handler() -> Any:
    """torch's elastic error handler, which still leaves a readable error file when the full one
    (message and traceback) cannot be written: a file-size limit (`ulimit -f`) or a full disk."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    class BoundedErrorFile(ErrorHandler):
        def record_exception(self, e: BaseException) -> None:
            try:
                super().record_exception(e)
                return
            except OSError as exc:
                path = self._get_error_file_path() or ""
                why = exc.strerror or str(exc)
                if exc.errno == errno.EFBIG:
                    why += " (a file-size limit, see ulimit -f)"
            data = {
                "message": {
                    "message": error_message(e),
                    "extraInfo": {
                        "py_callstack": f"(not kept: the rank's error file could not hold it: {why})",
                        "timestamp": str(int(time.time())),
                    },
                }
            }
            try:
                with open(path, "w") as fp:
                    json.dump(data, fp)
            except OSError:  # not even that: no file rather than a cut one (the store has the error)
                with contextlib.suppress(OSError):
                    os.remove(path)

    return BoundedErrorFile()


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


def _connect(rank: int, world_size: int, job: dict[str, Any]) -> _Store:
    """Connect to the launcher's store and report `joining`."""
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=float(job["join_timeout"]))
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=wait
    )
    reports = _Store(store, rank)
    reports.progress("joining")
    return reports


def _join(reports: _Store, world_size: int, local_rank: int, job: dict[str, Any]) -> Optional[str]:
    """Init the default group through the launcher's store; the rank's device."""
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=float(job["join_timeout"]))
    rank, store = reports.rank, reports.store
    device, cuda = _rank_device(job["options"].get("device"), local_rank)
    if cuda:
        import torch

        torch.cuda.set_device(local_rank)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=wait)
    return device


def _rank(job: dict[str, Any], handler: Any = None) -> None:
    """Trace the job on this rank; return on success, raise to say how it failed (see `main`).
    `handler`: the elastic error handler, which `record` gives only an Exception: a stop is told it here."""
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", rank)
    reports = _connect(rank, world_size, job)
    try:
        from ..runs.driver import driver_class

        joins = driver_class(job.get("driver", "factory")).joins_group
        # a factory's rank joins the group first; a script joins it itself, as under torchrun
        _traced(
            job, rank, world_size, reports, _join(reports, world_size, local_rank, job) if joins else None
        )
    except BaseException as exc:
        reports.error(exc)
        if handler is not None and isinstance(exc, Stopped):
            handler.record_exception(exc)
        raise


def _traced(job: dict[str, Any], rank: int, world_size: int, reports: _Store, device: Optional[str]) -> None:
    """Load the target or script, run it traced, write the trace; raise to say how the run failed."""
    _write(job, rank, world_size, reports, _run(job, reports, device))


def _run(job: dict[str, Any], reports: _Store, device: Optional[str]) -> Any:
    """Build the job's driver (runs/driver.py) and run it; the rank reports its steps."""
    import torch.distributed as dist

    from ..runs.driver import driver_class

    cls = driver_class(job.get("driver", "factory"))
    reports.progress(cls.first_phase)
    # a factory may init the group itself: it finds the rank's; a script's own call stays untouched
    with _factory_may_init(dist) if cls.joins_group else contextlib.nullcontext():
        try:
            driver = cls.from_job(job, device)
        except Stopped as exc:
            raise Stopped(exc.signal, f"{exc} while {LOADING}") from exc
        try:
            result = driver.run(lambda _result: None, on_step=reports.step, on_armed=_DEFERRAL.armed)
        except UsageError as exc:
            stop = _termination(exc)
            if stop is not None:  # not the target's fault: say what happened
                raise Stopped(stop.signal, f"{stop} while {LOADING}") from exc
            raise
    if result.exception is None and result.stopped_by is None and result.exit_code:
        result.error = f"the script exited with code {result.exit_code}"
        result.exception = SystemExit(result.exit_code)
    return result


def _write(job: dict[str, Any], rank: int, world_size: int, reports: _Store, result: Any) -> None:
    """Write the rank's trace; raise to say how its run failed."""
    if result.stopped_in == LOADING:  # nothing ran: an earlier trace at the path stays as it was
        raise Stopped(result.stopped_by, f"stopped by {result.stopped_by.name} while {LOADING}")
    reports.progress("writing")
    trace = result.trace
    trace.meta.rank = rank
    trace.meta.world_size = world_size
    path = rank_trace_path(job["out"], rank)
    try:
        trace.save(path)  # atomic: an earlier file stays whole until replaced
    except OSError as exc:  # as a single run says it (exit 2), in words every rank shares
        from ..io import write_error_words

        every = rank_trace_path(job["out"], 0).replace(".rank0.json", ".rank{r}.json")
        raise UsageError(f"cannot write {every}: {write_error_words(exc, path)}") from exc
    reports.notes(result.notes)
    if result.stopped_by is not None:  # a stop signal, where it landed (a hook, the model, the script)
        raise Stopped(result.stopped_by, f"stopped by {result.stopped_by.name} while in {result.stopped_in}")
    if result.exception is not None:
        stop = _termination(result.exception)
        if stop is not None:  # a stop signal a hook caught and raised as another exception
            where = (result.error or "").replace(f" raised {type(stop).__name__}: {stop}", "")
            raise Stopped(stop.signal, f"{stop} while in {where}") from result.exception
        raise RankFailed(result.error) from result.exception


def state_of(exc: Optional[BaseException]) -> str:
    """The rank state an exception from `_rank` stands for (None: it succeeded)."""
    if exc is None:
        return OK
    if _terminated(exc):
        return STOPPED
    if isinstance(exc, UsageError):
        return USAGE
    return FAILED if isinstance(exc, RankFailed) else CRASHED


def _end_with_launcher(job: str) -> None:
    """On Linux, SIGTERM to this rank when the launcher that started it dies (SIGKILL, a crash): the
    rank writes its partial trace and ends, as when the launcher stops it, never left running alone.
    Not under torchrun, whose workers live as torchrun leaves them (the job names no launcher)."""
    try:
        launcher = int(json.loads(job).get("launcher") or 0)
    except (ValueError, TypeError, AttributeError):
        return
    if not launcher or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher:  # it died before the prctl: as if told now
        raise Stopped(signal.SIGTERM, "stopped: the launcher ended")


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main(argv: Optional[list[str]] = None) -> int:
    """Run one rank from its JOB (JSON: target, out, options, join_timeout); the exit code says how it ended."""
    # First: importing torch takes seconds. A signal the rank was started ignoring (nohup) stays so.
    found = install(STOP_SIGNALS, _raise_terminated)
    args = sys.argv[1:] if argv is None else argv
    failure: Optional[BaseException] = None
    try:
        if len(args) != 1:
            raise UsageError("python -m hooktrace.ranks is started by hooktrace run --nproc N")
        _end_with_launcher(args[0])
        from torch.distributed.elastic.multiprocessing.errors import record

        # an exception is written to the rank's elastic error file
        handler = _error_handler()
        record(functools.partial(_rank, handler=handler), handler)(json.loads(args[0]))
    except (Exception, Stopped) as exc:
        failure = exc
    finally:
        restore(dict.fromkeys(found, signal.SIG_DFL))  # done: a late stop signal just ends the process
        dist = sys.modules.get("torch.distributed")
        if dist is not None:
            with contextlib.suppress(Exception):
                if dist.is_initialized():
                    dist.destroy_process_group()
    if failure is not None and state_of(failure) == USAGE and "TORCHELASTIC_ERROR_FILE" not in os.environ:
        print(f"error: {failure}", file=sys.stderr)  # started by hand
    return STATE_EXIT[state_of(failure)]
