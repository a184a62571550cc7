"""Messages a newcomer meets (issue 26, item 6): each says what happened and what to do, once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import hooktrace
from hooktrace.cli import _rank_files_note, main

from .test_cli import SAMPLES, invoke, restore_global_hooks, write  # noqa: F401
from .test_cli_errors import CNN, one_error_line


def test_nproc_says_where_the_per_rank_traces_go(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hooktrace.ranks as ranks

    monkeypatch.setattr(ranks, "run_ranks", lambda *a, **k: SimpleNamespace(usage_error="stopped here"))
    assert main(["run", str(SAMPLES / "quickstart.py"), "--nproc", "2", "-o", "r.svg"]) == 2
    err = capsys.readouterr().err
    note = err.splitlines()[0]
    assert note.startswith("note: --nproc writes one trace per rank: r.rank0.json and r.rank1.json")
    assert "(JSON, not r.svg)" in note and "hooktrace render r.rank0.json -o r.svg" in note


def test_nproc_with_a_json_path_names_the_files_without_the_render_advice() -> None:
    note = _rank_files_note("out/run.json", 4)
    assert note == "note: --nproc writes one trace per rank: out/run.rank0.json … out/run.rank3.json"
    assert _rank_files_note("t.json.gz", 1) == "note: --nproc writes one trace per rank: t.rank0.json.gz"


def test_an_option_without_its_value_points_to_the_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = one_error_line(["run", str(SAMPLES / "quickstart.py"), "-i"], capsys)
    assert code == 2 and line.endswith("see hooktrace run --help")
    code, line = one_error_line(["render", "x.json", "-o"], capsys)
    assert code == 2 and line.endswith("see hooktrace render --help")
    code, line = one_error_line(["--bogus"], capsys)  # no command: the top-level help
    assert code == 2 and line.endswith("see hooktrace --help")


def test_a_chrome_trace_given_to_render_is_explained_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chrome = tmp_path / "q.chrome.json"
    assert invoke("run", str(SAMPLES / "quickstart.py"), "-f", "chrome", "-o", str(chrome))[0] == 0
    code, line = one_error_line(["render", str(chrome)], capsys)
    assert code == 2 and "Chrome trace" in line
    assert line.count("hooktrace run -o") == 1 and line.count("give ") == 1
    not_json = tmp_path / "x.json"
    not_json.write_text("[1, 2]", encoding="utf-8")  # the nearest case: the CLI's advice is still given
    code, line = one_error_line(["render", str(not_json)], capsys)
    assert code == 2 and line.count("hooktrace run -o") == 1


def test_dir_shows_the_public_api_only() -> None:
    public = [n for n in dir(hooktrace) if not n.startswith("_")]
    assert public == sorted(hooktrace.__all__)
    for name in ("Any", "Optional", "sys", "TYPE_CHECKING", "annotations"):
        assert name not in dir(hooktrace)
    assert all(callable(getattr(hooktrace, n)) for n in hooktrace.__all__)
    assert "__version__" in dir(hooktrace)
    namespace: dict = {}
    exec("from hooktrace import *", namespace)
    assert sorted(n for n in namespace if n != "__builtins__") == sorted(hooktrace.__all__)


def test_float_inputs_of_another_dtype_than_the_model_suggest_its_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cnn = write(tmp_path / "cnn_bf16.py", CNN)
    args = ["run", str(cnn), "--input", "2x3x16x16"]
    code, line = one_error_line([*args, "--dtype", "bfloat16"], capsys)
    assert code == 2 and "int64" not in line
    assert "the inputs are bfloat16 but the model's parameters are float32: give --dtype float32" in line
    assert invoke(*args, "--dtype", "float32", "-f", "json")[0] == 0  # the advice works
    code, line = one_error_line(["run", str(cnn), "--input", "2x5x16x16"], capsys)  # a wrong shape instead
    assert code == 2 and "give the shape it expects" in line and "bfloat16" not in line


def test_the_help_says_the_target_file_is_imported() -> None:
    code, out, _ = invoke("run", "--help")
    assert code == 0 and "top-level code runs" in " ".join(out.split())
