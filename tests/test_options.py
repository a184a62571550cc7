"""Run options declared once (hooktrace/options.py): the CLI's flags and the rank workers' argv agree."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer.main

from hooktrace.cli import app
from hooktrace.options import OPTIONS, RunOptions, UsageError, module_path, view_options

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

EVERYTHING = RunOptions(
    input_shapes=("8x3", "2"),
    dtype="float64",
    device="cpu",
    backward=False,
    steps=3,
    optimizer="adamw",
    timeout=2.5,
    shapes=True,
)


@pytest.mark.parametrize("options", [RunOptions(), EVERYTHING, RunOptions(input_shapes=("4",), steps=2)])
def test_options_reach_a_rank_worker_unchanged(options: RunOptions) -> None:
    """Ranks get the options as JSON of their fields (ranks/launch.py) and rebuild them (worker.py)."""
    from hooktrace.ranks.job import _plain

    back = RunOptions(**json.loads(json.dumps(_plain(options))))
    assert dataclasses.replace(back, input_shapes=tuple(back.input_shapes)) == options


def test_every_field_has_a_flag() -> None:
    assert {f.name for f in dataclasses.fields(RunOptions)} <= set(OPTIONS)


def test_the_run_command_declares_the_same_flags() -> None:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    declared = {opt for p in command.params for opt in p.opts}
    for field in dataclasses.fields(RunOptions):
        assert set(OPTIONS[field.name].names) <= declared, field.name


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (RunOptions(steps=0), "--steps 0"),
        (RunOptions(input_shapes=("2xq",)), "bad --input '2xq'"),
        (RunOptions(dtype="float7"), "unknown --dtype 'float7'"),
        (RunOptions(device="gpu0"), "unknown --device 'gpu0'"),
        (RunOptions(optimizer="lbfgs"), "unknown --optimizer 'lbfgs'"),
        (RunOptions(timeout=0), "--timeout 0"),
        (RunOptions(timeout=-1.0), "more than 0"),
    ],
)
def test_check_refuses_without_torch(options: RunOptions, words: str) -> None:
    with pytest.raises(UsageError) as info:
        options.check()
    assert words in str(info.value)


def test_check_accepts_the_usual_values() -> None:
    assert EVERYTHING.check() is EVERYTHING
    for device in ("cpu", "CUDA", "cuda:1", "auto"):
        RunOptions(device=device, dtype="torch.long").check()


def test_module_path_takes_the_root_label_and_names_close_paths() -> None:
    paths = ["", "encoder", "encoder.layers.3", "encoder.layers.30", "head"]
    assert module_path(paths, "<root>") == module_path(paths, "") == ""
    assert module_path(paths, "encoder.layers.3") == "encoder.layers.3"
    with pytest.raises(UsageError, match=r"no module 'layers\.3'.*did you mean 'encoder\.layers\.3',"):
        module_path(paths, "layers.3")
    with pytest.raises(UsageError, match=r"did you mean 'head'"):
        module_path(paths, "haed")
    with pytest.raises(UsageError, match="unknown --phase 'sideways'"):
        view_options(None, None, "sideways", False, False)
    assert view_options(2, None, "optimizer", False, True) == {
        "depth": 2,
        "phase": "optimizer",
        "all_surprises": True,
    }


# -- numbers past their bounds: exit 2, one `error:` line naming the range, before anything runs ---------

BAD_NUMBERS = [
    (["--nproc", str(2**40)], "--nproc 1099511627776: give 1 to"),
    (["--nproc", "100000"], "--nproc 100000: give 1 to"),
    (["--nproc", "1025"], "--nproc 1025: give 1 to"),
    (["--steps", "99999999999999999999"], "--steps 99999999999999999999: give 1 to 10,000"),
    (["--steps", "10001"], "--steps 10001: give 1 to 10,000"),
    (["--warmup", "10001"], "--warmup 10001: give 0 to 10,000"),
    (["--warmup", "99999999999999999999"], "--warmup 99999999999999999999: give 0 to 10,000"),
    (
        ["--nproc", "1", "--timeout", "inf"],
        "--timeout inf: give a number of seconds more than 0 and at most 604800",
    ),
    (["--nproc", "1", "--timeout", "1e308"], "--timeout 1e+308: give"),
    (["--nproc", "1", "--timeout", "nan"], "--timeout nan: give"),
    (["--nproc", "1", "--timeout", "-inf"], "--timeout -inf: give"),
    (["--nproc", "1", "--timeout", "0"], "--timeout 0: give"),
    (["--nproc", "1", "--timeout", "604801"], "--timeout 604801: give"),
    (["--nproc", "2", "--rank", str(2**70)], "--rank 1180591620717411303424: give a rank from 0 to 1"),
    (["--input", "99999999999999999999x4"], "bad --input '99999999999999999999x4': a size past"),
]


@pytest.mark.parametrize(("args", "words"), BAD_NUMBERS, ids=[" ".join(a) for a, _ in BAD_NUMBERS])
def test_numbers_past_their_bounds_are_refused_with_the_range(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hooktrace.cli import main

    def never(*a: object, **k: object) -> None:
        raise AssertionError("a bad number reached the run")

    monkeypatch.setattr("hooktrace.ranks.launch._Watch.launch", never)
    monkeypatch.setattr("hooktrace.runs.factory.run", never)
    code = main(["run", str(SAMPLES / "quickstart.py"), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.splitlines()
    assert line.startswith("error: ") and words in line, line


def test_the_bounds_themselves_are_accepted() -> None:
    """The nearest cases: the largest allowed values pass the checks."""
    from hooktrace.options import MAX_STEPS, MAX_TIMEOUT, MAX_WARMUP, check_nproc, max_nproc

    assert RunOptions(
        steps=MAX_STEPS, warmup=MAX_WARMUP, timeout=MAX_TIMEOUT, input_shapes=(f"{2**63 - 1}x1",)
    ).check()
    assert check_nproc(max_nproc()) == max_nproc() and 8 <= max_nproc() <= 1024
    with pytest.raises(UsageError):
        check_nproc(max_nproc() + 1)


# -- docs/reference.md's option table: checked against the commands built from the option table --

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
BEGIN, END = "<!-- option table: begin", "<!-- option table: end -->"


def option_table() -> str:
    """Every option of every command, as the commands declare them (from options.OPTIONS): one row
    per option, the commands that take it, its help."""
    rows: dict[tuple[str, str], list[str]] = {}
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            names = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
            if param.metavar and not param.is_flag:
                names += f" `{param.metavar}`"
            names = names.replace("|", "\\|")
            help_text = " ".join((param.help or "").split()).replace("|", "\\|")
            rows.setdefault((names, help_text), []).append(name)
    lines = ["| option | commands | what it does |", "|---|---|---|"]
    lines += [f"| {names} | {', '.join(commands)} | {text} |" for (names, text), commands in rows.items()]
    return "\n".join(lines)


def test_reference_option_table_is_the_option_table() -> None:
    """docs/reference.md holds the table the commands are built from; HOOKTRACE_UPDATE_REFERENCE=1
    rewrites it."""
    import os

    text = REFERENCE.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    marker, rest = rest.split("-->", 1)
    _old, tail = rest.split(END, 1)
    expected = f"{head}{BEGIN}{marker}-->\n{option_table()}\n{END}{tail}"
    if os.environ.get("HOOKTRACE_UPDATE_REFERENCE") == "1":
        REFERENCE.write_text(expected, encoding="utf-8")
    assert text == expected, (
        "docs/reference.md's option table is stale: rerun with HOOKTRACE_UPDATE_REFERENCE=1"
    )


def test_reference_format_lists_are_the_renderer_registry() -> None:
    import re

    from hooktrace.render import RENDERERS

    lists = re.findall(r"--format ([a-z|]+)\]", REFERENCE.read_text(encoding="utf-8"))
    assert lists and all(found == "|".join(RENDERERS) for found in lists), lists
