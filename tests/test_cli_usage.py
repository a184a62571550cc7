"""Exit 2 with one `error:` line for every usage mistake, and how a failing run is named (docs/contract.md, Exit codes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hooktrace
from hooktrace.cli import main
from hooktrace.schema import Event, Hook, Trace

from .test_cli import RAISING_HOOK, invoke, restore_global_hooks, script, small_trace, write  # noqa: F401

# -- exit 2: one `error:` line, no traceback -------------------------------------------------------

NOT_A_TRACE = '{"format": "something else"}'


def _error_cases(tmp: Path) -> list[tuple[list[str], str]]:
    write(tmp / "raises.py", "def make():\n    raise RuntimeError('factory broke')\n")
    write(tmp / "wrong.py", "def make():\n    return 42\n")
    write(tmp / "noinputs.py", "from torch import nn\n\ndef make():\n    return nn.Linear(2, 2)\n")
    write(
        tmp / "ok.py",
        "import torch\nfrom torch import nn\n\ndef make():\n    return nn.Linear(2, 2), torch.ones(2)\n",
    )
    (tmp / "garbage.json").write_text("{not json")
    (tmp / "other.json").write_text(NOT_A_TRACE)
    small_trace().save(tmp / "good.json")
    cases = [
        (["run", str(tmp / "missing.py")], "file not found"),
        (["run", f"{tmp / 'ok.py'}:nope"], "no attribute 'nope'"),
        (["run", str(tmp / "raises.py")], "the factory make() raised RuntimeError: factory broke"),
        (["run", str(tmp / "wrong.py")], "returned a builtins.int; return an nn.Module"),
        (["run", str(tmp / "noinputs.py")], "no inputs: return (model, inputs)"),
        (["run", str(tmp / "noinputs.py"), "--input", "2xq"], "bad --input '2xq'"),
        (
            ["run", str(tmp / "noinputs.py"), "--input", "3x5"],
            "the model rejected --input 3x5: the root module raised",
        ),
        (
            ["run", str(tmp / "noinputs.py"), "--input", "3x2", "--dtype", "float64"],
            "rejected --input 3x2 --dtype",
        ),
        (["run"], "Missing argument 'TARGET'"),
        (["run", str(tmp / "ok.py"), "--dtype", "float7"], "unknown --dtype"),
        (["run", "no_such_module_ht.x:make"], "no module named 'no_such_module_ht'"),
        (["run", str(tmp / "ok.py"), "-o", str(tmp / "out.unknown")], "cannot tell the format"),
        (["run", str(tmp / "ok.py"), "--format", "png"], "unknown --format 'png'"),
        (["run", str(tmp / "ok.py"), "--phase", "sideways"], "unknown --phase"),
        (["run", str(tmp / "ok.py"), "--check", str(tmp / "garbage.json")], "is not valid JSON"),
        (["run", str(tmp / "ok.py"), "-o", str(tmp / "no" / "dir" / "x.json")], "cannot write"),
        (["run", str(tmp / "ok.py"), "--steps", "0"], "--steps"),
        (["run", str(tmp / "ok.py"), "--bogus"], "No such option"),
        (["render", str(tmp / "garbage.json")], "is not valid JSON"),
        (["render", str(tmp / "other.json")], "not a hooktrace trace"),
        (["render", str(tmp / "absent.json")], "trace file not found"),
        (["diff", str(tmp / "good.json"), str(tmp / "other.json")], "not a hooktrace trace"),
        (["hooks", str(tmp / "wrong.py")], "returned a builtins.int"),
    ]
    import torch

    if not torch.cuda.is_available():
        cases.append((["run", str(tmp / "ok.py"), "--device", "cuda"], "CUDA is not available"))
    return cases


def test_every_usage_error_is_one_line_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through `main()`, the console script's entry point, in this process (torch loads once)."""
    for args, words in _error_cases(tmp_path):
        code = main(args)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert code == 2, (args, err)
        assert "Traceback" not in err, args
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
        assert words in lines[0], (args, lines[0])
        assert out == "", args


CLICK_PARSE_ERRORS = ("--bogus", "--steps")


def test_usage_errors_through_cli_runner(tmp_path: Path) -> None:
    for args, words in _error_cases(tmp_path):
        if any(a in args for a in CLICK_PARSE_ERRORS) or args == ["run"]:
            continue  # click's own parser errors become one line in main(), tested above
        code, out, err = invoke(*args)
        assert code == 2, (args, err)
        assert err.startswith("error: ") and words in err, (args, err)
        assert "Traceback" not in err


def test_usage_errors_through_the_installed_script(tmp_path: Path) -> None:
    wanted = ("missing.py", "raises.py", "2xq", "--bogus", "garbage.json", "--device")
    cases = [
        (args, words) for args, words in _error_cases(tmp_path) if any(w in " ".join(args) for w in wanted)
    ]
    assert len(cases) >= len(wanted) - 1  # --device only without CUDA
    with ThreadPoolExecutor(max_workers=4) as pool:  # one process per case; importing torch dominates
        procs = list(pool.map(lambda case: script(*case[0]), cases))
    for (args, words), proc in zip(cases, procs):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, args
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, proc.stderr)
        assert proc.stdout == "", args


# -- naming the failure (hooktrace.runs.factory.describe_error) ------------------------------------


def _ev(seq: int, type_: str, module: str | None, hook: int | None = None, kind: str | None = None,
        error: str | None = None, phase: str = "forward") -> Event:  # fmt: skip
    return Event(seq, 0, type_, phase, module, hook, kind, 1, seq, 1, False, error)


def test_describe_error_names_the_hook_then_the_innermost_module() -> None:
    from hooktrace.runs.factory import describe_error

    hooks = [
        Hook(id=7, kind="forward", scope="global", name="audit"),
        Hook(id=8, kind="backward", scope="module", module="enc.fc", name="Clip.hook"),
    ]
    stop = "_StopRecomputationError: "
    trace = Trace(
        hooks=hooks,
        events=[
            _ev(0, "enter", ""),
            _ev(1, "exit", "enc.ckpt", error=stop, phase="recompute"),  # PyTorch's own, ignored
            _ev(2, "hook", "enc", 7, "forward", error="KeyError: 'caught by the model'"),
            _ev(3, "hook", "enc.fc", 8, "backward", error="ValueError: bad grad", phase="backward"),
            _ev(4, "exit", "", error="ValueError: bad grad"),
        ],
    )
    message = describe_error(trace, ValueError("bad grad"))
    assert (
        message
        == "backward hook Clip.hook raised ValueError: bad grad in backward of module 'enc.fc' (event #3, step 0)"
    )
    assert describe_error(trace, KeyError("caught by the model")).startswith(
        "global forward hook audit raised KeyError: 'caught by the model' in forward of module 'enc'"
    )
    modules_only = Trace(
        events=[
            _ev(0, "exit", "enc.fc", error="RuntimeError: x"),
            _ev(1, "exit", "", error="RuntimeError: x"),
        ]
    )
    assert describe_error(modules_only, RuntimeError("x")).startswith(
        "module 'enc.fc' raised RuntimeError: x"
    )
    root_only = Trace(events=[_ev(0, "exit", "", error="RuntimeError: x")])
    assert describe_error(root_only, RuntimeError("x")).startswith("the root module raised RuntimeError: x")
    assert describe_error(Trace(), RuntimeError("loss")) == (
        "the run raised RuntimeError: loss outside any traced module or hook"
    )


def test_raising_backward_hook_exits_1_and_names_it(tmp_path: Path) -> None:
    target = write(
        tmp_path / "bad_backward.py",
        """
        import torch
        from torch import nn

        def refuse(module, grad_input, grad_output):
            raise RuntimeError("no gradients today")

        def make():
            model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
            model[1].register_full_backward_hook(refuse)
            return model, torch.randn(2, 3)
        """,
    )
    out = tmp_path / "bw.json"
    code, _, err = invoke("run", str(target), "-o", str(out))
    assert code == 1
    assert (
        "run failed: backward hook refuse raised RuntimeError: no gradients today in backward of module '1'"
        in err
    )
    trace = hooktrace.load(out)
    assert [e.error for e in trace.hook_events()] == ["RuntimeError: no gradients today"]


def test_describe_error_of_a_hook_outside_any_module_names_no_module() -> None:
    """A tensor hook on an activation has no module: the line says where it ran, and nothing more."""
    from hooktrace.runs.factory import describe_error

    trace = Trace(
        hooks=[Hook(id=3, kind="grad", scope="tensor", tensor="tensor", name="Stop.on_grad")],
        events=[_ev(0, "hook", None, 3, "grad", error="RuntimeError: Stopped: SIGINT", phase="backward")],
    )
    assert describe_error(trace, RuntimeError("Stopped: SIGINT")) == (
        "tensor grad hook Stop.on_grad raised RuntimeError: Stopped: SIGINT in backward (event #0, step 0)"
    )
