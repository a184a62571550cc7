"""The `hooktrace` command line (docs/contract.md): parse, call the library, choose the exit code.

Exit codes: 0 success; 1 the run raised or a diff/check found a difference (the partial trace is
still rendered and written); 2 bad usage or input, reported as one `error: ...` line; 130 / 143 a run
stopped by SIGINT / SIGTERM (the partial trace is still rendered and written).
Only typer's public API is used. torch is imported only by `run` and `hooks`, once the target is found.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback as _traceback
from pathlib import Path
from typing import Any, List, NoReturn, Optional

import typer

from .compare import load_side_file, load_trace_file, print_comparison, safe_lines
from .options import Output, RunOptions, UsageError, View, check_format, grouped, option
from .outputs import anchored, check_renderable, real_stdout, started_streams
from .outputs import console as _console
from .outputs import emit_page as _emit
from .outputs import output as _output
from .outputs import shown as _given
from .outputs import stderr_line as _stderr
from .outputs import text_or_html as _text_or_html
from .ranks.show import rank_files_note as _rank_files_note  # noqa: F401  (tests read it here)
from .render import RENDERERS
from .runs.outcome import Shown, finish, show
from .supported import UnsupportedTorch

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2
FORMATS = tuple(RENDERERS)  # the renderer registry's names


def _show_version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"hooktrace {__version__}")
        raise typer.Exit()


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _hooktrace(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_show_version, help="Show the version and exit."
    ),
) -> None:
    """See the order in which PyTorch module, global and tensor hooks really fire, and why."""


def opt(name: str) -> Any:
    """A command's typer parameter, from the option table's row `name` (options.OPTIONS)."""
    return option(name, FORMATS)


# the View and Output groups' options (options.grouped): one declaration for run, exec and render
grouped_options = grouped(FORMATS)


def _fail(exc: BaseException, show_traceback: bool) -> NoReturn:
    """Exit 2 with one `error:` line (and the traceback when asked)."""
    if show_traceback:
        _traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if show_traceback:
        message = message.replace(" (--traceback shows where)", "")
    _stderr(f"error: {message}")
    raise typer.Exit(EXIT_USAGE)


# -- commands -------------------------------------------------------------------------------------


@app.command()
@grouped_options
def run(
    target: str = opt("target"),
    input: List[str] = opt("input_shapes"),
    dtype: Optional[str] = opt("dtype"),
    device: Optional[str] = opt("device"),
    no_backward: bool = opt("backward"),  # not a kind: an option
    steps: int = opt("steps"),
    warmup: int = opt("warmup"),
    optimizer: Optional[str] = opt("optimizer"),  # not a kind: an option
    shapes: bool = opt("shapes"),
    out: Output = Output(),
    nproc: Optional[int] = opt("nproc"),
    rank: Optional[int] = opt("rank"),
    timeout: Optional[float] = opt("timeout"),
    shown: View = View(),
    profile: Optional[Path] = opt("profile"),
    compare_eager: bool = opt("compare_eager"),
    traceback: bool = opt("traceback"),
) -> None:
    """Load TARGET, run forward and backward under the tracer, and show the order hooks fired."""
    try:
        if compare_eager:
            _compare_only(out, nproc=nproc, profile=profile)
        options = RunOptions(
            input_shapes=tuple(input),
            dtype=dtype,
            device=device,
            backward=not no_backward,
            steps=steps,
            warmup=warmup,
            optimizer=optimizer,
            timeout=timeout,
            shapes=shapes,
        ).check()
        view = shown.given()
        format, output, check, quiet = out.checked(FORMATS).astuple()
        output, profile = anchored(output), anchored(profile)
        if nproc is None:  # ranks write JSON, whatever -o says
            check_renderable(format, output)
        if nproc is None and (rank is not None or timeout is not None):
            raise UsageError("--rank and --timeout go with --nproc N; add --nproc or drop them")
        golden = load_side_file(check) if check is not None else None
        from .runs.profiling import check_profile_path, profiled

        check_profile_path(profile)
        if nproc is not None and profile is not None:
            raise UsageError("--profile goes with one process; drop --nproc, or profile one rank's script")
        shown_as = Shown(format, output, view, quiet, traceback)
        if nproc is not None:
            from .ranks.job import Job
            from .ranks.show import run_ranks

            job = Job("factory", target=target, options=dataclasses.replace(options, timeout=None))
            raise typer.Exit(run_ranks(job, nproc, rank, timeout, shown_as, golden))
        from .target import load_factory

        factory = load_factory(target)  # before importing torch: a missing file is reported at once
        if compare_eager:
            from .runs.compare import compare_run

            raise typer.Exit(_compared(compare_run(factory, options)))
        from .render.merged import merge_profile
        from .runs.factory import FactoryDriver

        with profiled(profile, merge_profile) as merged:
            result = FactoryDriver(factory, options, stop_signals=True).run(on_trace=lambda _result: None)
            merged.trace = result.trace
        if profile is not None:
            _stderr(
                f"wrote {_given(profile)} (torch.profiler's Chrome trace with hooktrace's events, aligned)"
            )
        show(result, shown_as, golden)
    except UsageError as exc:
        _fail(exc, traceback)
    raise typer.Exit(finish(result, shown_as, golden))


@app.command()
def hooks(
    target: str = opt("target"),
    expand: bool = opt("list_expand"),
    traceback: bool = opt("traceback"),
) -> None:
    """Registered hooks per module, in the order PyTorch will fire them; nothing runs."""
    try:
        from .target import load_factory

        factory = load_factory(target)
        from .analysis.listing import firing_order, group_modules
        from .render.listing import listing_text
        from .runs.factory import held_hooks

        found = held_hooks(factory)
    except UsageError as exc:
        _fail(exc, traceback)
    groups = group_modules(firing_order(found.trace, found.live), collapse=not expand)
    _console(highlight=False).print(listing_text(found.trace, groups, found.live))


@app.command()
@grouped_options
def render(
    trace_file: Path = opt("trace_file"),
    format: Optional[str] = opt("format"),
    output: Optional[Path] = opt("output"),
    shown: View = View(),
    traceback: bool = opt("traceback"),
) -> None:
    """Render a saved trace: the same picture as the run that made it."""
    try:
        view = shown.given()
        check_format(format, FORMATS)
        _output(load_trace_file(trace_file), format, output, view)
    except UsageError as exc:
        _fail(exc, traceback)


@app.command()
def diff(
    a: Path = opt("diff_a"),
    b: Path = opt("diff_b"),
    quiet: bool = opt("diff_quiet"),
    format: Optional[str] = opt("page_format"),
    output: Optional[Path] = opt("output"),
    traceback: bool = opt("traceback"),
) -> None:
    """Ordering differences between two saved traces or order files; exit 1 when they differ."""
    try:
        html = _text_or_html(format, output, "diff")
        first, second = load_side_file(a), load_side_file(b)
        if html:
            from .render.html import diff_html

            as_order = first.from_text or second.from_text  # compared as order files, as `diff` does
            ta, tb = (first.as_order(), second.as_order()) if as_order else (first.trace, second.trace)
            _emit(diff_html(ta, tb, str(a), str(b)), output, "html: both sides, differences marked")
    except UsageError as exc:
        _fail(exc, traceback)
    if html and output is None:  # stdout holds the page
        from .compare import compare_sides

        raise typer.Exit(EXIT_OK if compare_sides(first, second).equal else EXIT_DIFFERENT)
    raise typer.Exit(EXIT_OK if print_comparison(first, second, check=False, quiet=quiet) else EXIT_DIFFERENT)


def _command_path(group: Any, args: List[str], ctx: Any) -> str:
    """`hooktrace run` for an error in `run`'s options, also when click gives no context (an option
    missing its value is raised by click's parser, before the command's context exists)."""
    if ctx is not None and ctx.command_path != "hooktrace":
        return ctx.command_path
    first = next((a for a in args if not a.startswith("-")), None)
    return f"hooktrace {first}" if first in getattr(group, "commands", {}) else "hooktrace"


class _ScriptHelp(typer.core.TyperCommand):
    """`exec --help` without typer's type of its argument list (`SCRIPT.py [ARGS]... <list[str]>`)
    and with the usage line a user types (`SCRIPT.py [ARGS]...`, not `[SCRIPT.py [ARGS]...]...`)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        inner = type(formatter)(width=formatter.width)  # the formatter typer gave: written, then edited
        super().format_help(ctx, inner)
        text = inner.getvalue().replace(" <list[str]>", "")
        formatter.write(text.replace("[SCRIPT.py [ARGS]...]...", "SCRIPT.py [ARGS]..."))


@app.command(
    name="exec", cls=_ScriptHelp, context_settings={"allow_interspersed_args": False}, no_args_is_help=True
)
@grouped_options
def exec_(
    script: Optional[List[str]] = opt("script"),
    as_module: bool = opt("as_module"),
    start: int = opt("start"),
    steps: int = opt("exec_steps"),
    step_on: str = opt("step_on"),
    keep_running: bool = opt("keep_running"),
    shapes: bool = opt("shapes"),
    nproc: Optional[int] = opt("nproc"),
    rank: Optional[int] = opt("rank"),
    timeout: Optional[float] = opt("timeout"),
    compare_eager: bool = opt("exec_compare_eager"),
    out: Output = Output(),
    shown: View = View(),
    traceback: bool = opt("traceback"),
) -> None:
    """Run SCRIPT.py (or -m MODULE) as python would; trace the hooks of a window of its steps."""
    script = _script_args(script, as_module)
    try:
        if compare_eager:
            _compare_only(out, nproc=nproc)
            from .runs.script import ExecOptions, ScriptDriver

            scripted = ScriptDriver.of(
                script, as_module, ExecOptions(start, steps, step_on, keep_running, shapes)
            )
            raise typer.Exit(_compared_script(scripted.script, scripted.options))
        format, output, check, quiet = out.checked(FORMATS).astuple()
        output = anchored(output)
        if nproc is None and "RANK" not in os.environ:  # ranks write JSON, whatever -o says
            check_renderable(format, output)
        view = shown.given()
        from .runs.script import ExecOptions, ScriptDriver

        options = ExecOptions(start, steps, step_on, keep_running, shapes)
        driver = ScriptDriver.of(script, as_module, options)
        golden = load_side_file(check) if check is not None else None
        if nproc is None and (rank is not None or timeout is not None):
            raise UsageError("--rank and --timeout go with --nproc N; add --nproc or drop them")
        shown_as = Shown(format, output, view, quiet, traceback)
        if nproc is not None:
            from .ranks.job import Job
            from .ranks.show import run_ranks

            driver.script.for_ranks()
            job = Job("script", script=tuple(script or ()), as_module=as_module, options=options)
            raise typer.Exit(run_ranks(job, nproc, rank, timeout, shown_as, golden))
        result = driver.run(on_trace=lambda complete: show(complete, shown_as, golden))
        raise typer.Exit(finish(result, shown_as, golden))
    except UsageError as exc:
        _fail(exc, traceback)


def _compare_only(out: Output, nproc: Optional[int], profile: Optional[Path] = None) -> None:
    """UsageError for an option --compare-eager cannot go with: it prints one report."""
    given = [
        flag
        for flag, value in (("--format", out.format), ("-o", out.output), ("--check", out.check),
                            ("-q", out.quiet or None), ("--nproc", nproc), ("--profile", profile))
        if value is not None
    ]  # fmt: skip
    if given:
        raise UsageError(
            f"--compare-eager prints its report of two runs; drop {', '.join(given)} "
            "(trace each run alone to save or check it)"
        )


def _compared(result: Any) -> int:
    """Print `--compare-eager`'s report: exit 1 when the orders differ or a run raised."""
    for note in result.notes:
        _stderr(f"note: {note}")
    if result.comparison is not None:
        # the standard output the command started with, not a buffer the script left in sys.stdout
        print(safe_lines(result.comparison.report()), file=real_stdout(), flush=True)
    if result.error is not None:
        _stderr(f"run failed: {result.error}")
        return EXIT_DIFFERENT
    if result.comparison is None:
        _stderr("the compiled run did not take place: nothing to compare")
        return EXIT_DIFFERENT
    return EXIT_OK if result.comparison.diff.equal else EXIT_DIFFERENT


def _compared_script(target: Any, options: Any) -> int:
    """`exec --compare-eager`: run the script once, then print the report of its two windows."""
    from .runs.compare import CompareWindow
    from .runs.script import run_script
    from .runs.uncaught import report_uncaught

    result = run_script(target, options, lambda r: None, window_type=CompareWindow)
    if result.exit_message is not None:
        _stderr(result.exit_message)
    if result.exception is not None and result.traceback:  # as python reports it (its sys.excepthook)
        report_uncaught(result.exception)
    compared = result.compared
    if compared is None:
        _stderr("the script ended before the eager run's window opened: nothing to compare")
        return max(result.exit_code, EXIT_DIFFERENT)
    compared.notes = list(result.notes)
    if result.exception is not None:
        compared.error = result.error
    return max(_compared(compared), result.exit_code)


def _script_args(script: Optional[List[str]], as_module: bool) -> Optional[List[str]]:
    """SCRIPT and its arguments as the script gets them: a `--` right after SCRIPT separates
    hooktrace's command line from the script's and is not passed on; an argument that is one of
    exec's own options (or an abbreviation of one) goes to the script, with a warning on stderr."""
    if not script:
        return script
    if len(script) > 1 and script[1] == "--":
        return [script[0], *script[2:]]
    command = typer.main.get_command(app).commands["exec"]  # type: ignore[attr-defined]
    takes = {name: not p.is_flag for p in command.params for name in p.opts if name.startswith("-")}
    shown = f"-m {script[0]}" if as_module else script[0]
    for i, arg in enumerate(script[1:], 1):
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if not name.startswith("-") or name in ("-h", "--help"):
            continue
        own = (
            [name]
            if name in takes
            else [o for o in takes if o.startswith("--") and len(name) > 3 and o.startswith(name)]
        )
        if not own:
            continue
        given = arg if "=" in arg or not takes[own[0]] or i + 1 >= len(script) else f"{arg} {script[i + 1]}"
        if os.environ.get("RANK", "0") == "0":
            _stderr(
                f"warning: {given} comes after {shown}, so it went to the script, not to hooktrace's "
                f"{'/'.join(own)}; hooktrace's options go before the script: hooktrace exec {given} {shown} ..."
            )
    return script


@app.command()
def ranks(
    files: List[Path] = opt("rank_files"),
    format: Optional[str] = opt("page_format"),
    output: Optional[Path] = opt("output"),
    traceback: bool = opt("traceback"),
) -> None:
    """Do the ranks' hook orders agree? Per-rank traces from any nodes (exec under torchrun, run --nproc)."""
    try:
        html = _text_or_html(format, output, "ranks")
        traces = [(path, load_trace_file(path)) for path in files]
        from .ranks.summary import ranks_page, ranks_summary

        text, code = ranks_summary(traces)
        if html:
            _emit(ranks_page(traces), output, f"html: {len(traces)} ranks, the first divergence marked")
    except UsageError as exc:
        _fail(exc, traceback)
    if html and output is None:  # stdout holds the page
        _stderr(text)
    else:
        print(safe_lines(text))
    raise typer.Exit(code)


# an option of one command given to the other: what that command calls it
_OTHER_NAMES = {
    ("exec", "--warmup"): "exec runs K steps untraced before its window with --start K (run's --warmup)",
    ("run", "--start"): "run runs N steps untraced first with --warmup N (exec's --start)",
}


def main(argv: Optional[List[str]] = None) -> int:
    """Console-script entry point: every way out is an exit code and at most one `error:` line."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        with started_streams():  # what the command prints goes here, whatever a script does to sys.stdout
            code = command.main(args=args or ["--help"], prog_name="hooktrace", standalone_mode=False)
    except typer.TyperException as exc:  # click's own errors: unknown option, missing argument, ...
        ctx = getattr(exc, "ctx", None)
        path = _command_path(command, args, ctx)
        hint = f"; see {path} --help"
        message = " ".join(exc.format_message().split()).rstrip(".")
        for (where, flag), instead in _OTHER_NAMES.items():
            if path == f"hooktrace {where}" and message.startswith("No such option") and flag in message:
                hint = f": {instead}{hint}"
        _stderr(f"error: {message}{hint}")
        return EXIT_USAGE if getattr(exc, "exit_code", EXIT_USAGE) == EXIT_USAGE else EXIT_DIFFERENT
    except typer.Abort:
        _stderr("error: aborted")
        return EXIT_DIFFERENT
    except BrokenPipeError:  # `hooktrace run ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        _stderr("error: interrupted")
        return 130
    except UnsupportedTorch as exc:  # a torch older than 2.8, or one whose source a check refused
        _stderr(f"error: {exc}")
        return EXIT_USAGE
    except SystemExit as exc:  # something called sys.exit() outside a run
        return exc.code if isinstance(exc.code, int) else EXIT_DIFFERENT
    except BaseException as exc:  # a bug of ours, or of a library outside the model: one clean message
        if "--traceback" in args:
            _traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        where = "" if "--traceback" in args else " (--traceback shows where)"
        text = " ".join(str(exc).split())[:300]
        _stderr(f"error: hooktrace stopped on {type(exc).__name__}: {text}{where}")
        return EXIT_DIFFERENT
    return code if isinstance(code, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
