"""Run options declared once (hooktrace/options.py): the CLI's flags and the rank workers' argv agree."""

from __future__ import annotations

import dataclasses
import json

import pytest
import typer.main

from hooktrace.cli import app
from hooktrace.options import FLAGS, RunOptions, UsageError, module_path, view_options

EVERYTHING = RunOptions(
    input_shapes=("8x3", "2"),
    dtype="float64",
    device="cpu",
    backward=False,
    steps=3,
    optimizer="adamw",
    timeout=2.5,
)


@pytest.mark.parametrize("options", [RunOptions(), EVERYTHING, RunOptions(input_shapes=("4",), steps=2)])
def test_options_reach_a_rank_worker_unchanged(options: RunOptions) -> None:
    """Ranks get the options as JSON of their fields (ranks/launch.py) and rebuild them (worker.py)."""
    from hooktrace.ranks.launch import _plain

    back = RunOptions(**json.loads(json.dumps(_plain(options))))
    assert dataclasses.replace(back, input_shapes=tuple(back.input_shapes)) == options


def test_every_field_has_a_flag() -> None:
    assert {f.name for f in dataclasses.fields(RunOptions)} == set(FLAGS)


def test_the_run_command_declares_the_same_flags() -> None:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    declared = {opt for p in command.params for opt in p.opts}
    for flag in FLAGS.values():
        assert set(flag.names) <= declared, flag.names


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
