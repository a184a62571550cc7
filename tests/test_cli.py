"""The command line (docs/contract.md): through typer's CliRunner and through the installed `hooktrace` script."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
import torch.nn.modules.module as torch_module
from typer.testing import CliRunner

import hooktrace
from hooktrace.cli import app
from hooktrace.schema import Event, Hook, Meta, Module, Trace
from hooktrace.validate import from_dict

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
# the script installed beside this interpreter (a venv's bin/), whatever PATH says
SCRIPT = str(Path(sys.executable).parent / ("hooktrace.exe" if os.name == "nt" else "hooktrace"))


@contextlib.contextmanager
def global_hooks_restored() -> Iterator[None]:
    """Samples register global module hooks, which outlive the run in this process: undo them."""
    saved = {
        name: dict(value)
        for name, value in vars(torch_module).items()
        if name.startswith("_global_") and isinstance(value, dict)
    }
    try:
        yield
    finally:
        for name, value in saved.items():
            current = getattr(torch_module, name)
            current.clear()
            current.update(value)


@pytest.fixture(autouse=True)
def restore_global_hooks() -> Iterator[None]:
    with global_hooks_restored():
        yield


def invoke(*args: str) -> tuple[int, str, str]:
    """One CLI run in this process, as if it were its own process (global hooks undone after)."""
    with global_hooks_restored():
        result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def script(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    assert Path(SCRIPT).exists(), f"no hooktrace script beside {sys.executable} (pip install -e .)"
    return subprocess.run(
        [SCRIPT, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


RUN_OPTS: dict = {"capture_output": True, "text": True, "timeout": 600, "stdin": subprocess.DEVNULL}


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def small_trace() -> Trace:
    """A hand-built trace, so render/diff tests need no torch."""
    hooks = [Hook(id=1, kind="forward_pre", scope="module", module="", name="a", prepend=True)]
    events = [
        Event(0, 0, "enter", "forward", "", None, None, 1, 0, 10, False, None),
        Event(1, 0, "hook", "forward", "", 1, "forward_pre", 1, 1, 2, False, None),
        Event(2, 0, "exit", "forward", "", None, None, 1, 9, 0, False, None),
    ]
    return Trace(Meta(torch="x", python="3", target="t.py:make"), [Module("", "Net")], hooks, events)


RAISING_HOOK = """
    import torch
    from torch import nn

    CALLS = []

    def fine(module, args):
        CALLS.append("fine")

    def broken(module, args, output):
        raise ValueError("broken hook")

    def make():
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        model[0].register_forward_pre_hook(fine)
        model[0].register_forward_hook(broken)
        return model, torch.randn(2, 4)
"""


# -- run ------------------------------------------------------------------------------------------


def test_run_json_to_stdout_matches_what_the_hooks_recorded() -> None:
    code, out, _ = invoke("run", str(SAMPLES / "quickstart.py"), "--format", "json")
    assert code == 0
    trace = from_dict(json.loads(out))
    names = [trace.hook(e.hook).name for e in trace.hook_events()]
    calls = sys.modules["quickstart"].CALLS
    assert [n.split(":")[0] for n in calls] == names
    assert names[:3] == ["global_pre", "first_pre", "log_pre"]
    assert trace.meta.target == f"{SAMPLES / 'quickstart.py'}:make"
    first_pre = next(h for h in trace.hooks if h.name == "first_pre")
    assert first_pre.prepend and first_pre.prepend_source == "registration"
    assert first_pre.registered_at and first_pre.registered_at.endswith("quickstart.py:62")


def test_run_default_is_the_tree(tmp_path: Path) -> None:
    code, out, _ = invoke("run", str(SAMPLES / "quickstart.py"))
    assert code == 0
    assert "global_pre [global]" in out and "first_pre [prepend]" in out
    assert "global-first" in out


def test_run_writes_the_format_of_the_extension(tmp_path: Path) -> None:
    code, _, err = invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "run.json"))
    assert code == 0 and "wrote" in err
    assert hooktrace.load(tmp_path / "run.json").meta.steps == 1
    code, _, _ = invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "run.dot"))
    assert code == 0 and (tmp_path / "run.dot").read_text().lstrip().startswith("digraph")
    code, _, _ = invoke("run", str(SAMPLES / "quickstart.py"), "-f", "tree", "-o", str(tmp_path / "t.txt"))
    assert code == 0 and "first_pre [prepend]" in (tmp_path / "t.txt").read_text()


def test_steps_are_honoured(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    assert invoke("run", str(SAMPLES / "quickstart.py"), "--steps", "3", "-o", str(out))[0] == 0
    trace = hooktrace.load(out)
    assert trace.meta.steps == 3
    assert sorted({e.step for e in trace.events}) == [0, 1, 2]
    per_step = [[(e.hook, e.module) for e in trace.hook_events() if e.step == s] for s in range(3)]
    assert per_step[0] == per_step[1] == per_step[2]
    assert len(sys.modules["quickstart"].CALLS) == 3 * len(per_step[0])


def test_no_backward(tmp_path: Path) -> None:
    out = tmp_path / "fwd.json"
    code, _, err = invoke("run", str(SAMPLES / "quickstart.py"), "--no-backward", "-o", str(out))
    assert code == 0 and "--no-backward" in err
    assert {e.phase for e in hooktrace.load(out).events} == {"forward"}


def test_backward_skipped_when_nothing_requires_grad(tmp_path: Path) -> None:
    target = write(
        tmp_path / "frozen.py",
        """
        import torch
        from torch import nn

        def make():
            model = nn.Linear(3, 3).requires_grad_(False)
            model.register_full_backward_hook(lambda m, gi, go: None)
            return model, torch.randn(2, 3)
        """,
    )
    code, _, err = invoke("run", str(target), "-o", str(tmp_path / "f.json"))
    assert code == 0
    assert "backward skipped: nothing in the output requires grad" in err


def test_input_shapes_and_dtype(tmp_path: Path) -> None:
    target = write(
        tmp_path / "bare.py",
        """
        from torch import nn

        SEEN = []

        def make():
            model = nn.Bilinear(3, 5, 2).double()
            model.register_forward_pre_hook(lambda m, args: SEEN.append([(a.shape, a.dtype) for a in args]))
            return model
        """,
    )
    code, _, err = invoke("run", str(target), "--input", "4x3", "--input", "4x5", "-f", "json")
    assert code == 0, err
    import torch

    assert sys.modules["bare"].SEEN == [
        [(torch.Size([4, 3]), torch.float64), (torch.Size([4, 5]), torch.float64)]
    ]


def test_package_module_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ht_cli_pkg").mkdir()
    write(tmp_path / "ht_cli_pkg" / "__init__.py", "")
    write(
        tmp_path / "ht_cli_pkg" / "nets.py",
        """
        import torch
        from torch import nn

        def tiny():
            model = nn.Linear(2, 2)
            model.register_forward_hook(lambda m, a, o: None)
            return model, torch.randn(1, 2)
        """,
    )
    proc = script("run", "ht_cli_pkg.nets:tiny", "-f", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["meta"]["target"] == "ht_cli_pkg.nets:tiny"


def test_raising_hook_exits_1_with_partial_trace_written(tmp_path: Path) -> None:
    target = write(tmp_path / "raising.py", RAISING_HOOK)
    out = tmp_path / "partial.json"
    proc = script("run", str(target), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "forward hook broken raised ValueError: broken hook" in proc.stderr
    assert "module '0'" in proc.stderr
    trace = hooktrace.load(out)
    failed = [e for e in trace.hook_events() if e.error]
    assert [trace.hook(e.hook).name for e in failed] == ["broken"]
    assert failed[0].error == "ValueError: broken hook"
    assert [trace.hook(e.hook).name for e in trace.hook_events()] == ["fine", "broken"]


def test_raising_hook_tree_still_rendered() -> None:
    code, out, err = invoke("run", str(SAMPLES / "always_call.py"))
    assert code == 1
    assert "release_resources [always_call]" in out
    assert "run failed: module 'flaky' raised RuntimeError: flaky layer failed on purpose" in err
    assert sys.modules["always_call"].CALLS == ["before", "release_resources"]


def test_traceback_flag_shows_the_traceback(tmp_path: Path) -> None:
    target = write(tmp_path / "bad.py", "def make():\n    raise KeyError('boom')\n")
    proc = script("run", str(target), "--traceback")
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "raise KeyError('boom')" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the factory make() raised KeyError")


def test_svg_without_dot_says_how_to_install(tmp_path: Path) -> None:
    small_trace().save(tmp_path / "t.json")
    empty = tmp_path / "empty_path"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hooktrace",
            "render",
            str(tmp_path / "t.json"),
            "-o",
            str(tmp_path / "t.svg"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Graphviz" in lines[0], proc.stderr
    assert not (tmp_path / "t.svg").exists()


# -- render, diff, --check ------------------------------------------------------------------------


def test_render_gives_the_same_picture_as_the_run(tmp_path: Path) -> None:
    from hooktrace.render import render
    from hooktrace.runs.factory import run
    from hooktrace.target import load_factory

    result = run(load_factory(str(SAMPLES / "checkpoint_recompute.py")))
    result.trace.save(tmp_path / "r.json")
    assert invoke("render", str(tmp_path / "r.json"), "-f", "tree", "-o", str(tmp_path / "b.txt"))[0] == 0
    assert (tmp_path / "b.txt").read_text() == render(result.trace, "tree")
    code, out, _ = invoke("render", str(tmp_path / "r.json"), "--phase", "recompute")
    phases = [line for line in out.splitlines() if line.startswith(("├── ", "└── "))]
    assert code == 0 and len(phases) == 1 and phases[0].startswith("└── recompute")


def test_diff_and_check(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a.json", "b.json", "c.json"))
    assert invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(a))[0] == 0
    assert invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(b))[0] == 0
    assert invoke("run", str(SAMPLES / "prepend_displaced.py"), "-o", str(c))[0] == 0
    assert invoke("diff", str(a), str(b))[:2] == (0, f"same hook order: {a} and {b}\n")
    code, out, _ = invoke("diff", str(a), str(c))
    assert code == 1 and out.strip()
    assert invoke("run", str(SAMPLES / "quickstart.py"), "--check", str(a), "-o", str(b))[0] == 0
    code, out, err = invoke("run", str(SAMPLES / "prepend_displaced.py"), "--check", str(a), "-f", "json")
    assert code == 1 and err.strip()
    assert from_dict(json.loads(out)).meta.target.endswith(
        "prepend_displaced.py:make"
    )  # stdout: one document
    code, _, _ = invoke("run", str(SAMPLES / "prepend_displaced.py"), "--check", str(a), "-o", str(c))
    assert code == 1
    assert c.exists()  # the trace is still written when the check fails


def test_nproc_writes_one_trace_per_rank_and_names_the_divergence(tmp_path: Path) -> None:
    out = tmp_path / "div.json"
    proc = script("run", "samples/rank_divergence.py", "--nproc", "2", "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "ranks diverge" in proc.stdout and "log_activation" in proc.stdout
    ranks = [hooktrace.load(tmp_path / f"div.rank{r}.json") for r in (0, 1)]
    assert [(t.meta.rank, t.meta.world_size) for t in ranks] == [(0, 2), (1, 2)]
    names = [{t.hook(e.hook).name for e in t.hook_events()} for t in ranks]
    assert names[1] - names[0] == {"log_activation"}


# -- hooks ----------------------------------------------------------------------------------------


def test_hooks_lists_firing_order_without_running() -> None:
    code, out, _ = invoke("hooks", str(SAMPLES / "quickstart.py"))
    assert code == 0
    assert "nothing was run" in out
    assert out.index("global_pre  [global]") < out.index("first_pre  [prepend]") < out.index("3. log_pre")
    assert "registered samples/quickstart.py:62" in out
    assert sys.modules["quickstart"].CALLS == []


def test_hooks_folds_repeated_layers_unless_expanded() -> None:
    code, out, _ = invoke("hooks", "samples/transformer.py")
    assert code == 0
    assert "×11 more with the same hooks (encoder.layers.1 … encoder.layers.11;" in out
    assert "\nencoder.layers.3.norm2 " not in out
    code, expanded, _ = invoke("hooks", "samples/transformer.py", "--expand")
    assert (
        code == 0
        and "\nencoder.layers.11.norm2  LayerNorm" in expanded
        and "more with the same" not in expanded
    )
    assert len(out.splitlines()) * 4 < len(expanded.splitlines())


def test_hooks_leaves_out_hooks_the_factory_removed(tmp_path: Path) -> None:
    target = write(
        tmp_path / "removed.py",
        """
        from torch import nn

        def kept(module, args):
            pass

        def dropped(module, args):
            pass

        def make():
            model = nn.Linear(2, 2)
            handle = model.register_forward_pre_hook(dropped)
            model.register_forward_pre_hook(kept, with_kwargs=True)
            handle.remove()
            return model
        """,
    )
    code, out, _ = invoke("hooks", str(target))
    assert code == 0
    assert "1. kept  [kwargs]" in out and "dropped" not in out


def test_hooks_shows_library_hooks_with_their_call_sites() -> None:
    proc = script("hooks", "samples/quantization.py")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    conv = (
        out[out.index("\nconv ") : out.index("\nrelu ")] if "\nrelu " in out else out[out.index("\nconv ") :]
    )
    assert conv.index("_observer_forward_hook  [prepend]") < conv.index("inspect_output")
    assert "registered torch/ao/quantization/quantize.py:" in conv


# -- start-up cost and entry points ---------------------------------------------------------------


_IMPORTED = """
import sys
from hooktrace.cli import main
code = main(sys.argv[1:])
print("EXIT", code, "TORCH", "torch" in sys.modules)
"""


def test_render_and_diff_do_not_import_torch_whatever_their_options(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    small_trace().save(trace)
    command_lines = [
        ["render", str(trace)],
        ["render", str(trace), "-f", "json", "-o", str(tmp_path / "o.json"), "--depth", "2",
         "--module", "<root>", "--phase", "forward", "--expand"],
        ["diff", str(trace), str(trace)],
        ["-h"],
        ["--version"],
    ]  # fmt: skip
    for args in command_lines:  # one process each, so no command hides what another imports
        proc = subprocess.run([sys.executable, "-c", _IMPORTED, *args], **RUN_OPTS, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert "EXIT 0 TORCH False" in proc.stdout, (args, proc.stdout, proc.stderr)


def test_a_missing_target_file_is_reported_before_torch_is_imported(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTED, "run", str(tmp_path / "nothere.py")], **RUN_OPTS, cwd=ROOT
    )
    assert "EXIT 2 TORCH False" in proc.stdout, proc.stdout
    assert proc.stderr.startswith("error: file not found:")


def test_only_public_modules_of_dependencies_are_imported() -> None:
    """Issue 15 item 5: no `typer._click`, `typer._coercion`, ... anywhere in hooktrace."""
    import ast

    for path in sorted((ROOT / "hooktrace").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id in ("typer", "click", "rich", "graphviz", "orjson"):
                    names = [f"{node.value.id}.{node.attr}"]
            for name in names:
                private = [p for p in name.split(".")[1:] if p.startswith("_") and not p.startswith("__")]
                if name.split(".")[0] in ("typer", "click", "rich", "graphviz", "orjson"):
                    assert not private, f"{path.relative_to(ROOT)}: {name}"


def test_version_and_short_help() -> None:
    code, out, _ = invoke("--version")
    assert code == 0 and out.strip() == f"hooktrace {hooktrace.__version__}"
    code, out, _ = invoke("run", "-h")
    assert code == 0 and "--optimizer" in out and "--all-surprises" in out


def test_python_dash_m_and_the_script_agree() -> None:
    proc = subprocess.run([sys.executable, "-m", "hooktrace", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "run" in proc.stdout and "hooks" in proc.stdout
    assert script("--help").stdout == proc.stdout.replace("python -m hooktrace", "hooktrace")


def test_json_gz_output_is_the_trace_format_compressed(tmp_path: Path) -> None:
    import gzip

    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    assert invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(plain))[0] == 0
    assert invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(packed))[0] == 0
    loaded = json.loads(gzip.decompress(packed.read_bytes()))
    assert loaded["format"] == "hooktrace.trace" and loaded["events"]
    code, out, _ = invoke("diff", str(plain), str(packed))
    assert code == 0, out
    code, out, _ = invoke("render", str(packed))
    assert code == 0 and "first_pre" in out
