"""Every option of every command, declared once: the option table (`OPTIONS`, one `Flag` per row),
from which `cli.py` builds each command's typer parameters (`option(name)`); and the values they
make: `RunOptions` (one run: `run`, and each rank of `run --nproc`), the view and output groups
that `run`, `exec` and `render` share (`View`, `Output`, `grouped`), and the checks of their values.

`RunOptions.check()` validates without importing torch, so a bad value fails before the (slow)
factory runs; rank workers receive the same `RunOptions` as JSON of its fields.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, List, Optional, get_type_hints

from .kinds import PHASES, ROOT

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32"}
OPTIMIZERS = ("sgd", "adam", "adamw")
PHASE_CHOICES = PHASES
ROOT_LABEL = ROOT  # how the tree shows the root module; `--module "<root>"` selects it
HIDING = ("hide_library", "hide")  # View's options that leave hooks out of every rendering but the trace file
_DEVICE = re.compile(r"(cpu|auto|meta|cuda(:\d+)?)")
# Bounds of the numbers a run takes. A trace keeps every event in memory (benchmarks/README.md has
# the bytes per event) and hook order settles within a few steps: --steps stops at ten thousand.
# --warmup keeps nothing in memory but costs the time of a step each, and first-call work is over
# after one or two: it stops at ten thousand too. --timeout is a finite number of seconds up to a week. --nproc: see
# `max_nproc`.
MAX_STEPS = 10_000
MAX_WORLD_SIZE = 1 << 20  # more ranks than any job runs: a world size past it is refused, not listed
MAX_WARMUP = 10_000
MAX_TIMEOUT = 7 * 24 * 3600.0
_MAX_SIZE = 2**63 - 1  # one --input size: what torch takes as a size at all


class UsageError(Exception):
    """Bad usage or input (exit code 2): the message says what to do."""


# `exec --step-on`: what ends a step (capture/steps.py StepWatch). Option values, not kinds or phases.
STEP_OPTIMIZER = "optimizer"  # not a kind
STEP_BACKWARD = "backward"  # not a kind
STEP_FORWARD = "forward"  # not a kind
STEP_ON = (STEP_OPTIMIZER, STEP_BACKWARD, STEP_FORWARD)
FORMATS_PLACEHOLDER = "{formats}"  # in a help text: the renderer registry's names, filled in by cli.py


@dataclass(frozen=True)
class Flag:
    """One option or argument of the command line, declared once: its spellings, help and value."""

    names: tuple[str, ...]  # "--input", "-i"; empty for an argument
    help: str
    metavar: Optional[str] = None
    default: Any = None
    bounds: tuple[Optional[float], Optional[float]] = (None, None)  # typer's min / max
    argument: bool = False  # a positional argument (`default` ... when it is required)


# THE option table: every option and argument of every command (`cli.py` builds each typer
# parameter from its row with `option(name)`; docs/reference.md's option table is checked against
# it by tests/test_options.py). Keys of RunOptions / ExecOptions fields are the fields' names.
OPTIONS: dict[str, Flag] = {
    # -- what `run` and `hooks` load, `render`, `diff`, `ranks` read, `exec` runs
    "target": Flag((), "FILE.py:NAME or package.module:NAME (NAME defaults to make). The file is imported, "
                   "so its top-level code runs; NAME is then called inside the capture.", "TARGET", ..., argument=True),
    "trace_file": Flag((), "A trace written by hooktrace run -o.", "TRACE.json", ..., argument=True),
    "diff_a": Flag((), "The expected order: a saved trace or an order file.", "A", ..., argument=True),
    "diff_b": Flag((), "The order to compare with it (the same kinds of file).", "B", ..., argument=True),
    "rank_files": Flag((), "One trace per rank.", "TRACE.rank0.json ...", ..., argument=True),
    "script": Flag((), "The script and its arguments, as for python; everything after SCRIPT is the "
                   "script's (hooktrace's options go before it).", "SCRIPT.py [ARGS]...", None, argument=True),
    "as_module": Flag(("-m",), "Run the first argument as a module, as python -m MODULE [ARGS]... does.",
                      default=False),
    # -- one run (RunOptions)
    "input_shapes": Flag(("--input", "-i"), "Input shape like 8x3x32x32, once per positional argument.",
                         "SHAPE", default=[]),
    "dtype": Flag(("--dtype",), "dtype of --input tensors (default: the model's).", "DTYPE"),
    "device": Flag(
        ("--device",),
        "Move model and inputs there (auto: CUDA if any; meta: a dry run on shapes, no values); "
        "default: inputs follow the model.",
        "cpu|cuda|auto|meta",
    ),
    "backward": Flag(("--no-backward",), "Run forward only.", default=False),
    "steps": Flag(("--steps",), "Iterations of forward, backward (and optimizer step).", "N", 1, (1, None)),
    "warmup": Flag(
        ("--warmup",),
        "Steps to run untraced before the traced ones (default 0): their first-call work stays out "
        "of the times; hooks registered meanwhile are still in the trace. Steps are numbered from 0 "
        "after them.",
        "N",
        0,
        (0, None),
    ),
    "optimizer": Flag(
        ("--optimizer",),
        "Each step also runs optimizer.step() and zero_grad(): sgd|adam|adamw over the model's "
        "parameters, PyTorch's default settings (lr 0.001).",
        "NAME",
    ),
    "shapes": Flag(
        ("--shapes",),
        "Also record the shapes, dtypes and devices of the tensors each hook received and returned "
        "(tree, HTML details, JSON); off by default.",
        default=False,
    ),
    # -- eager vs compiled (runs/compare.py)
    "compare_eager": Flag(
        ("--compare-eager",),
        "Run the steps twice in one process, first under torch.compiler.set_stance(\"force_eager\") "
        "(hooks as plain Python), then compiled, and report how the compiled run's hook order differs "
        "and why (stale graph, inlined hooks, wrapper calls, recompiles); the factory is called once. "
        "Prints the report instead of the trace; exit 1 when the orders differ.",
        default=False,
    ),
    "exec_compare_eager": Flag(
        ("--compare-eager",),
        "Trace the --steps steps from --start on under torch.compiler.set_stance(\"force_eager\"), "
        "then the next --steps steps as the script runs them (compiled), and report how the compiled "
        "steps' hook order differs and why; the script runs once. Prints the report instead of the "
        "trace; exit 1 when the orders differ.",
        default=False,
    ),
    # -- ranks (run --nproc, exec --nproc)
    "nproc": Flag(("--nproc",), "Ranks to launch (one trace each).", "N", None, (1, None)),
    "rank": Flag(("--rank",), "With --nproc: the rank to show.", "R", None, (0, None)),
    "timeout": Flag(
        ("--timeout",),
        "With --nproc: seconds a rank may outlive another rank, or go without progress, before it "
        "is stopped and reported as hung (default 60; more than 0).",
        "SECONDS",
    ),
    # -- `exec`'s window (runs/script.py ExecOptions)
    # `-s`: under torchrun, whose parser takes `--start` for an abbreviation of its `--start-method`
    "start": Flag(
        ("--start", "-s"),
        "Steps to run untraced before the window opens, as run --warmup (-s under torchrun).",
        "K",
        0,
        (0, None),
    ),
    "exec_steps": Flag(("--steps",), "Steps traced in the window.", "N", 1, (1, None)),
    "step_on": Flag(
        ("--step-on",),
        f"What ends a step: each optimizer.step() of any optimizer ({STEP_OPTIMIZER}), each outermost "
        f"backward() ({STEP_BACKWARD}), or each outermost module call ({STEP_FORWARD}: for inference; in "
        "training, a window opened at a forward's end does not trace that forward's backward).",
        "|".join(STEP_ON),
        STEP_OPTIMIZER,
    ),
    "keep_running": Flag(
        ("--keep-running",),
        "After the window, let the script run on untraced instead of stopping it.",
        default=False,
    ),
    # -- output (Output)
    "format": Flag(
        ("--format", "-f"),
        f"{FORMATS_PLACEHOLDER}; default: from the -o extension, else tree.",
        "FORMAT",
    ),
    "page_format": Flag(("--format", "-f"), "text (default) or html: one page, differences marked.", "FORMAT"),
    "output": Flag(("--output", "-o"), "Write to this file instead of the terminal.", "PATH"),
    "check": Flag(
        ("--check",), "Exit 1 unless the order equals this saved trace or order file.", "GOLDEN.json|GOLDEN.txt"
    ),
    "quiet": Flag(("--quiet", "-q"), "With --check: print only the differences (nothing when equal).",
                  default=False),
    "diff_quiet": Flag(("--quiet", "-q"), "Print only the differences (nothing when equal).", default=False),
    "profile": Flag(
        ("--profile",),
        "Also run under torch.profiler and write one Chrome/Perfetto file here: the profiler's events and hooktrace's, aligned (hooks and module calls as ranges).",
        "PATH",
    ),
    # -- the tree's view (View)
    "depth": Flag(("--depth",), "Tree: show module calls nested at most this deep.", "N", None, (0, None)),
    "module": Flag(
        ("--module",),
        f'Tree: only this module path and what runs inside it ("{ROOT}" is the root).',
        "PATH",
    ),
    "phase": Flag(("--phase",), f"Tree: only {'|'.join(PHASES)}.", "PHASE"),
    "expand": Flag(("--expand",), "Tree: do not collapse repeated identical siblings.", default=False),
    "list_expand": Flag(("--expand",), "List every module; do not fold repeats.", default=False),
    "all_surprises": Flag(
        ("--all-surprises",), "Tree: show info-level surprises too, not only their count.", default=False
    ),
    "hide_library": Flag(
        ("--hide-library",),
        "Leave out hooks whose code is in torch or an installed package (counted as hidden); "
        "not from the trace file.",
        default=False,
    ),
    "hide": Flag(
        ("--hide",),
        "Leave out hooks whose name or defining file matches GLOB (repeatable); not from the trace file.",
        "GLOB",
    ),
    # -- every command
    "traceback": Flag(("--traceback",), "Show the Python traceback of an error.", default=False),
}  # fmt: skip
# not a kind: the view options' names
VIEW_FLAGS = {
    name: OPTIONS[name].names[0]
    for name in ("depth", "module", "phase", "expand", "all_surprises", "hide_library", "hide")  # not a kind
}


def option(name: str, formats: tuple[str, ...] = ()) -> Any:
    """The typer parameter of the option table's row `name`; `formats` fills the help's format list."""
    import typer

    flag = OPTIONS[name]
    text = flag.help.replace(FORMATS_PLACEHOLDER, "|".join(formats))
    low, high = flag.bounds
    if flag.argument:
        return typer.Argument(flag.default, metavar=flag.metavar, help=text)
    return typer.Option(flag.default, *flag.names, metavar=flag.metavar, help=text, min=low, max=high)


@dataclass(frozen=True)
class RunOptions:
    """Every option of one run. Defaults are the command line's defaults."""

    input_shapes: tuple[str, ...] = ()
    dtype: Optional[str] = None
    device: Optional[str] = None
    backward: bool = True
    steps: int = 1
    warmup: int = 0
    optimizer: Optional[str] = None
    timeout: Optional[float] = None  # --nproc only; None: the launcher's default
    shapes: bool = False  # record what each hook received and returned (capture/shapes.py)

    def __post_init__(self) -> None:  # a list (from JSON) is kept as a tuple: options stay hashable
        object.__setattr__(self, "input_shapes", tuple(self.input_shapes))

    def check(self) -> RunOptions:
        """Raise UsageError for a value no run could use; torch is not imported. Returns self."""
        check_steps(self.steps)
        check_warmup(self.warmup)
        for text in self.input_shapes:
            parse_shape(text)
        if self.dtype is not None:
            dtype_name(self.dtype)
        if self.device is not None and not _DEVICE.fullmatch(self.device.strip().lower()):
            raise UsageError(f"unknown --device {self.device!r}; use cpu, cuda, cuda:N, auto or meta")
        if self.optimizer is not None and self.optimizer.lower() not in OPTIMIZERS:
            raise UsageError(f"unknown --optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if self.timeout is not None:
            check_timeout(self.timeout)
        return self


def max_nproc() -> int:
    """The most ranks `--nproc` starts on this machine: 4 per CPU core, at least 8, at most 1024
    (every rank is a process that imports torch: hundreds of MB each)."""
    return min(1024, max(8, 4 * (os.cpu_count() or 1)))


def check_steps(steps: int) -> int:
    """`--steps`: 1 to MAX_STEPS (UsageError otherwise)."""
    why = "(each step's events stay in memory; hook order settles within a few steps)"
    return _count("--steps", steps, 1, MAX_STEPS, why)


def check_warmup(warmup: int) -> int:
    """`--warmup`: 0 to MAX_WARMUP (UsageError otherwise)."""
    return _count(
        "--warmup", warmup, 0, MAX_WARMUP, "steps to run untraced first (one or two are usually enough)"
    )


def _count(flag: str, value: int, low: int, high: int, why: str) -> int:
    if not low <= value <= high:
        raise UsageError(f"{flag} {value}: give {low} to {high:,} {why}")
    return value


def check_timeout(seconds: float) -> float:
    """`--timeout`: a finite number of seconds, more than 0 and at most MAX_TIMEOUT (a week)."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise UsageError(
            f"--timeout {seconds:g}: give a number of seconds more than 0 and at most {MAX_TIMEOUT:.0f} (a week)"
        )
    return seconds


def check_nproc(nproc: int) -> int:
    """`--nproc`: 1 to `max_nproc()` ranks (UsageError otherwise)."""
    limit = max_nproc()
    if not 1 <= nproc <= limit:
        raise UsageError(
            f"--nproc {nproc}: give 1 to {limit} (4 ranks per CPU core of this machine, at least 8, "
            "at most 1024: every rank is a process that imports torch)"
        )
    return nproc


# -- view and output options (run, exec, render), declared once -------------------------------------


@dataclass(frozen=True)
class View:
    """The tree's view options, as `run`, `exec` and `render` take them."""

    depth: Optional[int] = None
    module: Optional[str] = None
    phase: Optional[str] = None
    expand: bool = False
    all_surprises: bool = False
    hide_library: bool = False
    hide: Optional[List[str]] = None

    def given(self) -> dict[str, Any]:
        """The options given (UsageError for an unknown --phase), as `view_options`."""
        given = view_options(self.depth, self.module, self.phase, self.expand, self.all_surprises)
        if self.hide_library:
            given["hide_library"] = True
        if self.hide:
            given["hide"] = tuple(self.hide)
        return given


@dataclass(frozen=True)
class Output:
    """Where a traced run's picture goes and what it is checked against: `run` and `exec`."""

    format: Optional[str] = None
    output: Optional[Path] = None
    check: Optional[Path] = None
    quiet: bool = False

    def checked(self, formats: tuple[str, ...]) -> Output:
        """Self, or UsageError for `-q` without `--check` or an unknown `--format`."""
        if self.quiet and self.check is None:
            raise UsageError("-q goes with --check GOLDEN; add --check or drop -q")
        check_format(self.format, formats)
        return self

    def astuple(self) -> tuple[Optional[str], Optional[Path], Optional[Path], bool]:
        return self.format, self.output, self.check, self.quiet


def check_format(fmt: Optional[str], formats: tuple[str, ...]) -> None:
    if fmt is not None and fmt not in formats:
        raise UsageError(f"unknown --format {fmt!r}; use one of {', '.join(formats)}")


GROUPS = (View, Output)


def grouped(formats: tuple[str, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for typer commands: each parameter annotated `View` or `Output` stands for the
    group's fields, declared from the option table (`option(field name)`) in its place (so `--help`
    keeps their order); the command is called with one value of the group."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        params: list[inspect.Parameter] = []
        groups: dict[str, Any] = {}
        for param in signature.parameters.values():
            if param.annotation not in GROUPS:
                params.append(param)
                continue
            groups[param.name] = param.annotation
            hints = get_type_hints(param.annotation)
            for f in fields(param.annotation):
                declared = option(f.name, formats)
                params.append(param.replace(name=f.name, annotation=hints[f.name], default=declared))

        @functools.wraps(command)
        def run_command(**given: Any) -> Any:
            for name, group in groups.items():
                given[name] = group(**{f.name: given.pop(f.name) for f in fields(group)})
            return command(**given)

        run_command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run_command.__annotations__ = {p.name: p.annotation for p in params}
        return run_command

    return decorate


def view_options(
    depth: Optional[int], module: Optional[str], phase: Optional[str], expand: bool, all_surprises: bool
) -> dict[str, Any]:
    """The display options given (not their defaults)."""
    if phase is not None and phase not in PHASE_CHOICES:
        raise UsageError(f"unknown --phase {phase!r}; use one of {', '.join(PHASE_CHOICES)}")
    given = dict(depth=depth, module=module, phase=phase, expand=expand, all_surprises=all_surprises)
    return {k: v for k, v in given.items() if v is not None and v is not False}


def module_path(paths: list[str], module: str) -> str:
    """`--module` -> a module path of the trace (`Trace.module_paths()`): the root label is "", a
    path or the parent of one is itself; UsageError naming close ones. The one rule of `run`,
    `render` and the tree renderer."""
    if module in (ROOT_LABEL, "(root)"):
        return ""
    if module in paths or any(p.startswith(module + ".") for p in paths):
        return module
    close = [p for p in paths if p.endswith("." + module)]
    close += [p for p in difflib.get_close_matches(module, paths, n=3) if p not in close]
    hint = f"did you mean {', '.join(repr(p) for p in close[:3])}?" if close else ""
    if not hint:
        shown = ", ".join(repr(p or ROOT_LABEL) for p in paths[:6]) + (", ..." if len(paths) > 6 else "")
        hint = f"module paths are {shown}" if paths else "the trace has no modules"
    raise UsageError(f"no module {module!r} in this trace; {hint} (give --module PATH or {ROOT_LABEL!r})")


# -- values ---------------------------------------------------------------------------------------


def parse_shape(text: str) -> tuple[int, ...]:
    """`"8x3x32x32"` -> (8, 3, 32, 32); also accepts `,` between sizes."""
    parts = [p.strip() for p in text.lower().replace(",", "x").replace("×", "x").split("x")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(s <= 0 for s in shape):
        raise UsageError(f"bad --input {text!r}: give positive sizes joined by 'x', e.g. --input 8x3x32x32")
    if max(shape) > _MAX_SIZE:
        raise UsageError(
            f"bad --input {text!r}: a size past {_MAX_SIZE:,} (torch's sizes are 64-bit); give a smaller shape"
        )
    return shape


def dtype_name(text: str) -> str:
    """`--dtype` value -> one of DTYPES (`torch.` prefix and the usual aliases accepted)."""
    key = text.strip().lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"unknown --dtype {text!r}; use one of {', '.join(DTYPES)}")
    return key
