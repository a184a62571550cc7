"""The `hooktrace` command line (SPEC §2): parse, call the library, choose the exit code.

Exit codes: 0 success; 1 the run raised or a diff/check found a difference (the partial trace is
still rendered and written); 2 bad usage or input, reported as one `error: ...` line.
torch is imported only by `run` and `hooks`, so `--help`, `render` and `diff` start fast; nor is
pydantic, which newer typer imports to convert option values (see `_PlainValues`).
"""

from __future__ import annotations

import os
import sys
import traceback as _traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, NoReturn, Optional, get_args, get_origin

import typer
from typer.core import TyperCommand, TyperGroup

from .target import UsageError

PIPE_WIDTH = 120

if TYPE_CHECKING:
    from .schema import Trace

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2
FORMATS = ("tree", "json", "dot", "svg", "chrome")
PHASE_CHOICES = ("forward", "backward", "recompute", "other")

# -- option values without pydantic ---------------------------------------------------------------
# typer >= 0.29 converts every non-flag value through a pydantic TypeAdapter, and importing pydantic
# costs `render` and `diff` more than all the rest of their start-up (issue 5). This CLI takes only
# plain str, int, float, Path and List[str] values: they are converted here exactly as typer does,
# and anything else (a bad or out-of-range number, an unreadable path, bytes) goes to typer's own
# conversion, so its error messages stay word for word. Older typer (click types) is left alone.
_TYPER = object()  # "let typer decide"
_PLAIN_PATH = {  # typer's defaults: with these, a Path is only checked for being readable if it exists
    "exists": False,
    "file_okay": True,
    "dir_okay": True,
    "readable": True,
    "writable": False,
    "resolve_path": False,
    "allow_dash": False,
    "path_type": None,
}


def _plain_value(annotation: Any, info: Any, value: Any) -> Any:
    """`value` as typer would convert it for `annotation`, or _TYPER when typer must decide."""
    if annotation is str and isinstance(value, str):
        return value
    if annotation in (int, float) and isinstance(value, str) and not getattr(info, "clamp", True):
        digits = value.replace(".", "", 1) if annotation is float else value
        if digits.isascii() and digits.isdigit() and len(digits) < 16:  # long: typer's limits apply
            number = annotation(value)
            low, high = getattr(info, "min", None), getattr(info, "max", None)
            if (low is None or number >= low) and (high is None or number <= high):
                return number
        return _TYPER
    if annotation is Path and isinstance(value, str) and "\0" not in value:
        if all(getattr(info, name, None) == plain for name, plain in _PLAIN_PATH.items()):
            if not os.path.exists(value) or os.access(value, os.R_OK):
                return Path(value)
        return _TYPER
    if get_origin(annotation) is list and isinstance(value, (list, tuple)):
        items = [_plain_value(get_args(annotation)[0], info, item) for item in value]
        return _TYPER if any(item is _TYPER for item in items) else items
    return _TYPER


class _PlainValues:
    """One parameter's value conversion (typer's RuntimeParam protocol): plain values here,
    the rest by typer's own, which is built (and imports pydantic) only when first needed."""

    def __init__(self, typers: Callable[[], Any]) -> None:
        self._typers = typers

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        descriptor = param.type_descriptor
        plain = _plain_value(descriptor.annotation, descriptor.parameter_info, value)
        if plain is _TYPER:
            return self._typers().coerce(value, param=param, ctx=ctx)
        return plain


def _convert_plain_values(params: List[Any]) -> List[Any]:
    """Give each typer parameter `_PlainValues` (typer's, created lazily, stays the fallback)."""
    for param in params:
        typers = getattr(param, "get_runtime_param", None)
        if (
            typers is not None
            and hasattr(param, "type_descriptor")
            and "get_runtime_param" not in vars(param)
        ):
            plain = _PlainValues(typers)
            param.get_runtime_param = lambda plain=plain: plain
    return params


class _Command(TyperCommand):
    """typer's command; its parameters (--help too, made on first use) converted by `_PlainValues`."""

    def get_params(self, ctx: Any) -> List[Any]:
        return _convert_plain_values(super().get_params(ctx))


class _Group(TyperGroup):
    """typer's group: its own --help is a parameter too (the commands are `_Command`s)."""

    def get_params(self, ctx: Any) -> List[Any]:
        return _convert_plain_values(super().get_params(ctx))


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="See the order in which PyTorch module, global and tensor hooks really fire, and why.",
)

# -- shared options -------------------------------------------------------------------------------
FORMAT_OPT = typer.Option(
    None,
    "--format",
    "-f",
    metavar="FORMAT",
    help="tree|json|dot|svg|chrome; default: from the -o extension, else tree.",
)
OUTPUT_OPT = typer.Option(
    None, "--output", "-o", metavar="PATH", help="Write to this file instead of the terminal."
)
DEPTH_OPT = typer.Option(
    None, "--depth", metavar="N", min=0, help="Tree: show module calls nested at most this deep."
)
MODULE_OPT = typer.Option(
    None, "--module", metavar="PATH", help="Tree: only this module path and what runs inside it."
)
PHASE_OPT = typer.Option(
    None, "--phase", metavar="PHASE", help="Tree: only forward|backward|recompute|other."
)
EXPAND_OPT = typer.Option(False, "--expand", help="Tree: do not collapse repeated identical siblings.")
TRACEBACK_OPT = typer.Option(False, "--traceback", help="Show the Python traceback of an error.")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fail(exc: BaseException, show_traceback: bool) -> NoReturn:
    """Exit 2 with one `error:` line (and the traceback when asked)."""
    if show_traceback:
        _traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    _stderr(f"error: {message}")
    raise typer.Exit(EXIT_USAGE)


def _tree_options(depth: Optional[int], module: Optional[str], phase: Optional[str], expand: bool) -> dict:
    if phase is not None and phase not in PHASE_CHOICES:
        raise UsageError(f"unknown --phase {phase!r}; use one of {', '.join(PHASE_CHOICES)}")
    return {"depth": depth, "module": module, "phase": phase, "expand": expand}


def _console(**options: Any) -> Any:
    """A rich console; piped output gets 120 columns (unless COLUMNS says otherwise), not rich's 80,
    so hook lines stay whole for grep and scripts."""
    from rich.console import Console

    console = Console(soft_wrap=False, **options)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def _output(trace: Trace, fmt: Optional[str], output: Optional[Path], tree_opts: dict) -> None:
    """Render to the terminal (tree: rich, colour when it is a terminal) or write to `output`."""
    from . import render as r

    try:
        chosen = r.format_for_path(str(output) if output else None, fmt)
        if output is None and chosen == "tree":
            from .render.tree import build_tree

            _console().print(build_tree(trace, **tree_opts))
            return
        takes = r.renderer(chosen).options
        if chosen == "json" and output is not None and output.name.lower().endswith(".gz"):
            data = None  # Trace.save compresses it
        else:
            data = r.render(trace, chosen, **{k: v for k, v in tree_opts.items() if k in takes})
    except r.RenderError as exc:
        raise UsageError(str(exc)) from exc
    if output is None:
        assert data is not None
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data if data.endswith("\n") else data + "\n")
        sys.stdout.flush()
        return
    try:
        if data is None:
            trace.save(output)
        elif isinstance(data, bytes):
            output.write_bytes(data)
        else:
            output.write_text(data, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}; check the folder exists") from exc
    _stderr(f"wrote {output} ({chosen}: {len(trace.hooks)} hooks, {len(trace.events)} events)")


def _load_trace(path: Path) -> Trace:
    from .schema import TraceFormatError, load

    if not path.exists():
        raise UsageError(f"trace file not found: {path}; write one with hooktrace run TARGET -o {path.name}")
    try:
        return load(path)
    except TraceFormatError as exc:
        raise UsageError(
            f"cannot read {path}: {exc}; give a trace written by hooktrace run -o FILE.json"
        ) from exc
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _compare(
    expected: Trace, observed: Trace, expected_name: str, observed_name: str, *, check: bool
) -> bool:
    """Print the ordering differences; True when the orders are equal.

    `diff` prints to stdout; `run --check` to stderr, as its stdout may hold a JSON trace."""
    from .analysis.diff import diff_traces

    stream = sys.stderr if check else sys.stdout
    result = diff_traces(expected, observed)
    if result.equal:
        print(f"same hook order: {expected_name} and {observed_name}", file=stream)
        return True
    print(result.summary(), file=stream)
    return False


def _run_ranks(
    target: str,
    nproc: int,
    rank: Optional[int],
    timeout: Optional[float],
    options: dict,
    device: Optional[str],
    fmt: Optional[str],
    output: Optional[Path],
    golden: Optional[Trace],
    check: Optional[Path],
    tree_opts: Optional[dict] = None,
) -> int:
    """`--nproc N`: one trace per rank (`-o PATH` -> `PATH.rank{r}.json`); show one rank, then the summary."""
    from .ranks import DEFAULT_TIMEOUT, run_ranks

    ranks = run_ranks(
        target,
        nproc,
        out=str(output) if output is not None else None,
        options={**options, "device": device},
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
        show_rank=rank or 0,
    )
    if ranks.usage_error is not None:
        raise UsageError(ranks.usage_error)
    if ranks.shown is not None:
        _output(ranks.shown, fmt, None, tree_opts or {})
    if fmt in (None, "tree"):
        print(ranks.summary())
    else:  # keep stdout one document (`-f json | jq`)
        _stderr(ranks.summary())
    code = ranks.exit_code
    if golden is not None and ranks.shown is not None:
        if not _compare(golden, ranks.shown, str(check), f"rank {ranks.show_rank}", check=True):
            code = max(code, EXIT_DIFFERENT)
    return code


def _positive_seconds(value: Optional[float]) -> Optional[float]:
    if value is not None and not value > 0:  # 0 would stop every rank at once; NaN never
        raise typer.BadParameter(f"{value:g} is not a positive number of seconds")
    return value


# -- commands -------------------------------------------------------------------------------------


@app.command(cls=_Command)
def run(
    target: str = typer.Argument(
        ..., metavar="TARGET", help="FILE.py:NAME or package.module:NAME (NAME defaults to make)."
    ),
    input: List[str] = typer.Option(
        [], "--input", "-i", metavar="SHAPE", help="Input shape like 8x3x32x32, once per argument."
    ),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", metavar="DTYPE", help="dtype of --input tensors (default: model's)."
    ),
    device: Optional[str] = typer.Option(
        None,
        "--device",
        metavar="cpu|cuda|auto",
        help="Move model and inputs there (auto: CUDA if any); default: inputs follow the model.",
    ),
    no_backward: bool = typer.Option(False, "--no-backward", help="Run forward only."),
    steps: int = typer.Option(1, "--steps", metavar="N", min=1, help="Forward(+backward) iterations."),
    format: Optional[str] = FORMAT_OPT,
    output: Optional[Path] = OUTPUT_OPT,
    check: Optional[Path] = typer.Option(
        None, "--check", metavar="GOLDEN.json", help="Exit 1 unless the order equals this trace."
    ),
    nproc: Optional[int] = typer.Option(
        None, "--nproc", metavar="N", min=1, help="Ranks to launch (one trace each)."
    ),
    rank: Optional[int] = typer.Option(
        None, "--rank", metavar="R", min=0, help="With --nproc: the rank to show."
    ),
    timeout: Optional[float] = typer.Option(
        None,
        "--timeout",
        metavar="SECONDS",
        callback=_positive_seconds,
        help="With --nproc: how long a rank may outlive another, or go without progress (default 60).",
    ),
    depth: Optional[int] = DEPTH_OPT,
    module: Optional[str] = MODULE_OPT,
    phase: Optional[str] = PHASE_OPT,
    expand: bool = EXPAND_OPT,
    traceback: bool = TRACEBACK_OPT,
) -> None:
    """Load TARGET, run forward and backward under the tracer, and show the order hooks fired."""
    try:
        tree_opts = _tree_options(depth, module, phase, expand)
        golden = _load_trace(check) if check is not None else None
        if format is not None and format not in FORMATS:
            raise UsageError(f"unknown --format {format!r}; use one of {', '.join(FORMATS)}")
        if nproc is None and (rank is not None or timeout is not None):
            raise UsageError("--rank and --timeout go with --nproc N; add --nproc or drop them")
        if nproc is not None:
            run_options = {"steps": steps, "backward": not no_backward, "input_shapes": input, "dtype": dtype}
            code = _run_ranks(
                target, nproc, rank, timeout, run_options, device, format, output, golden, check, tree_opts
            )
            raise typer.Exit(code)
        from .capture.run import run as run_target
        from .target import load_factory

        result = run_target(
            load_factory(target),
            steps=steps,
            backward=not no_backward,
            input_shapes=input,
            dtype=dtype,
            device=device,
        )
        _output(result.trace, format, output, tree_opts)
    except UsageError as exc:
        _fail(exc, traceback)
    for note in result.notes:
        _stderr(f"note: {note}")
    code = EXIT_OK
    if result.exception is not None:
        if traceback:
            exc = result.exception
            _traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        _stderr(f"run failed: {result.error}")
        code = EXIT_DIFFERENT
    if golden is not None and not _compare(golden, result.trace, str(check), target, check=True):
        code = EXIT_DIFFERENT
    raise typer.Exit(code)


@app.command(cls=_Command)
def hooks(
    target: str = typer.Argument(
        ..., metavar="TARGET", help="FILE.py:NAME or package.module:NAME (NAME defaults to make)."
    ),
    expand: bool = typer.Option(False, "--expand", help="List every module; do not fold repeats."),
    traceback: bool = TRACEBACK_OPT,
) -> None:
    """Registered hooks per module, in the order PyTorch will fire them; nothing runs."""
    try:
        from .capture.run import firing_order, group_modules, inventory
        from .target import load_factory

        found = inventory(load_factory(target))
    except UsageError as exc:
        _fail(exc, traceback)

    groups = group_modules(firing_order(found.trace, found.live), collapse=not expand)
    _console(highlight=False).print(_inventory_text(found.trace, groups, found.live))


def _flags(hook: Any) -> str:
    flags = []
    if hook.scope == "global":
        flags.append("global")
    if hook.prepend:
        flags.append("prepend" if hook.prepend_source != "inferred" else "prepend (inferred)")
    if hook.with_kwargs:
        flags.append("kwargs")
    if hook.always_call:
        flags.append("always")
    return " ".join(f"[{f}]" for f in flags)


def _inventory_text(trace: Trace, groups: list, live: set[int]) -> Any:
    from rich.text import Text

    types = {m.path: m.type for m in trace.modules}
    text = Text()
    text.append(f"Hooks of {trace.meta.target}, in the order PyTorch will fire them (nothing was run)\n")
    if not groups:
        text.append("\nno hooks registered\n")
        return text
    for group in groups:
        label = "(root)" if group.module == "" else group.module
        text.append(f"\n{label}", style="bold")
        text.append(f"  {types.get(group.module, '')}\n", style="dim")
        for row in group.rows:
            where = f" on {row.tensor}" if row.tensor else ""
            text.append(f"  {row.kind}{where}\n", style="cyan")
            for n, hook in enumerate(row.hooks, 1):
                text.append(f"    {n}. {hook.name}")
                flags = _flags(hook)
                if flags:
                    text.append(f"  {flags}", style="yellow")
                text.append(f"\n         defined    {hook.defined_at or '?'}\n", style="dim")
                text.append(f"         registered {hook.registered_at or 'before capture'}", style="dim")
                if hook.registered_by and hook.registered_by != hook.registered_at:
                    text.append(f"  by {hook.registered_by}", style="dim")
                text.append("\n")
        if group.same:
            span = group.same[0] if len(group.same) == 1 else f"{group.same[0]} … {group.same[-1]}"
            text.append(
                f"  ×{len(group.same)} more with the same hooks ({span}; --expand shows them)\n", "dim"
            )
    n_global = sum(1 for h in trace.hooks if h.scope == "global" and h.id in live)
    if n_global:
        text.append(
            f"\nglobal hooks ({n_global}) fire first for every module, also those not listed\n", "dim"
        )
    return text


@app.command(cls=_Command)
def render(
    trace_file: Path = typer.Argument(..., metavar="TRACE.json", help="A trace written by hooktrace run -o."),
    format: Optional[str] = FORMAT_OPT,
    output: Optional[Path] = OUTPUT_OPT,
    depth: Optional[int] = DEPTH_OPT,
    module: Optional[str] = MODULE_OPT,
    phase: Optional[str] = PHASE_OPT,
    expand: bool = EXPAND_OPT,
    traceback: bool = TRACEBACK_OPT,
) -> None:
    """Render a saved trace: the same picture as the run that made it."""
    try:
        tree_opts = _tree_options(depth, module, phase, expand)
        if format is not None and format not in FORMATS:
            raise UsageError(f"unknown --format {format!r}; use one of {', '.join(FORMATS)}")
        _output(_load_trace(trace_file), format, output, tree_opts)
    except UsageError as exc:
        _fail(exc, traceback)


@app.command(cls=_Command)
def diff(
    a: Path = typer.Argument(..., metavar="A.json", help="The expected trace."),
    b: Path = typer.Argument(..., metavar="B.json", help="The trace to compare with it."),
    traceback: bool = TRACEBACK_OPT,
) -> None:
    """Ordering differences between two saved traces; exit 1 when they differ."""
    try:
        first, second = _load_trace(a), _load_trace(b)
    except UsageError as exc:
        _fail(exc, traceback)
    raise typer.Exit(EXIT_OK if _compare(first, second, str(a), str(b), check=False) else EXIT_DIFFERENT)


def main(argv: Optional[List[str]] = None) -> int:
    """Console-script entry point: click's own usage errors become one `error:` line too."""
    try:  # newer typer vendors click
        from typer._click import exceptions as click_exceptions
    except ImportError:
        from click import exceptions as click_exceptions
    # click < 8.2 has no NoArgsIsHelpError: it prints the help for a bare `hooktrace` and exits 0 itself
    no_args_is_help = getattr(click_exceptions, "NoArgsIsHelpError", ())

    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="hooktrace", standalone_mode=False)
    except no_args_is_help as exc:  # bare `hooktrace`: the help, as --help gives it
        print(exc.format_message())
        return EXIT_OK
    except click_exceptions.UsageError as exc:
        hint = f"; see {exc.ctx.command_path} --help" if exc.ctx is not None else "; see hooktrace --help"
        message = " ".join(exc.format_message().split()).rstrip(".")
        _stderr(f"error: {message}{hint}")
        return EXIT_USAGE
    except click_exceptions.Abort:
        _stderr("error: aborted")
        return EXIT_DIFFERENT
    except BrokenPipeError:  # `hooktrace run ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        _stderr("error: interrupted")
        return 130
    return code if isinstance(code, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
