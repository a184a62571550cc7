"""A torch hooktrace does not support gets one line at the first use, never an error from inside the
capture: `UnsupportedTorch` in the API, `error: ...` and exit 2 on the command line.

The version is faked (torch.__version__), and an internal that an old torch lacks is faked by
deleting it in a fresh interpreter before hooktrace's capture is imported (torch 2.8 stopped with
`KeyError: 'unpack_hook'` there before the capture read `SavedTensor.unpack_hook` only where it exists).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace import supported
from hooktrace.cli import main

from .test_cli import ROOT, write

MODEL = "import torch\n\ndef make():\n    return torch.nn.Linear(2, 2), torch.ones(1, 2)\n"


def _class_state() -> dict:
    return {**vars(nn.Module), **{("opt", k): v for k, v in vars(torch.optim.Optimizer).items()}}


@pytest.mark.parametrize(
    "version, release",
    [("2.8.0+cu128", (2, 8)), ("2.10.0a0+git1234", (2, 10)), ("2.15.0", (2, 15)), ("2.7.1", (2, 7))],
)
def test_release_reads_major_and_minor(version: str, release: tuple[int, int]) -> None:
    assert supported.release(version) == release


def test_an_older_torch_is_refused_in_the_api_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.7.1")
    before = _class_state()
    m = nn.Linear(2, 2)
    with pytest.raises(hooktrace.UnsupportedTorch) as info:
        with hooktrace.trace(m):
            m(torch.ones(2))
    assert str(info.value) == "hooktrace supports torch 2.8–2.15; this is 2.7.1"
    assert isinstance(info.value, RuntimeError)
    assert _class_state() == before  # nothing of the capture stays installed


@pytest.mark.parametrize("version", ["2.8.0+cu128", "2.15.0"])
def test_the_oldest_and_newest_supported_are_traced(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    # the nearest cases: the version alone does not refuse them (the source checks still run)
    monkeypatch.setattr(torch, "__version__", version)
    m = nn.Linear(2, 2)
    fired = []
    m.register_forward_hook(lambda *a: fired.append("hook"))
    with hooktrace.trace(m) as t:
        m(torch.ones(2))
    assert fired == ["hook"] and [e.type for e in t.trace.events] == ["enter", "hook", "exit"]


def test_an_older_torch_is_refused_on_the_command_line_before_the_model_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch, "__version__", "2.7.1")
    made = tmp_path / "made"
    target = write(
        tmp_path / "model.py",
        MODEL.replace("def make():\n", f"def make():\n    open({str(made)!r}, 'w').close()\n"),
    )
    code = main(["run", str(target)])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines() == ["error: hooktrace supports torch 2.8–2.15; this is 2.7.1"]
    assert not made.exists()


def _fresh(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


def test_an_older_torch_is_refused_at_the_capture_import_in_a_fresh_process(tmp_path: Path) -> None:
    # nothing of the capture was imported yet: the line comes before its modules read PyTorch's internals
    target = write(tmp_path / "model.py", MODEL)
    done = _fresh(
        "import sys, torch\n"
        "torch.__version__ = '2.7.1'\n"
        "from hooktrace.cli import main\n"
        f"sys.exit(main(['run', {str(target)!r}]))\n",
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["error: hooktrace supports torch 2.8–2.15; this is 2.7.1"]
    api = _fresh(
        "import torch\n"
        "torch.__version__ = '2.7.1'\n"
        "import hooktrace\n"
        "try:\n"
        "    hooktrace.trace(torch.nn.Linear(2, 2))\n"
        "except hooktrace.UnsupportedTorch as exc:\n"
        "    print('refused:', exc)\n",
        tmp_path,
    )
    assert api.returncode == 0, api.stderr
    assert api.stdout.splitlines() == ["refused: hooktrace supports torch 2.8–2.15; this is 2.7.1"]


def test_an_internal_missing_at_the_capture_import_is_one_line_not_an_internal_error(tmp_path: Path) -> None:
    # as torch 2.8's SavedTensor without `unpack_hook` was: here a supported version whose autograd
    # module lacks a function the capture reads when it is imported
    target = write(tmp_path / "model.py", MODEL)
    done = _fresh(
        "import sys, torch\n"
        "del torch._C._autograd._push_saved_tensors_default_hooks\n"
        "from hooktrace.cli import main\n"
        f"sys.exit(main(['run', {str(target)!r}]))\n",
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"error: hooktrace supports torch 2.8–2.15; this is {torch.__version__} (AttributeError: "
    )
    assert "_push_saved_tensors_default_hooks" in line and "Traceback" not in done.stderr


def test_saved_tensor_hooks_are_traced_where_saved_tensors_have_no_unpack_hook(tmp_path: Path) -> None:
    # torch 2.8 and 2.9's SavedTensor has no `unpack_hook` to read back (2.10 added it): nothing to hide then,
    # and the pack/unpack hooks are traced in the order they ran
    done = _fresh(
        "import torch\n"
        "if hasattr(torch._C._autograd.SavedTensor, 'unpack_hook'):  # torch 2.10 and later\n"
        "    del torch._C._autograd.SavedTensor.unpack_hook\n"
        "import hooktrace\n"
        "ran = []\n"
        "def pack(x):\n    ran.append('pack'); return x\n"
        "def unpack(x):\n    ran.append('unpack'); return x\n"
        "a = torch.tensor(2.0, requires_grad=True)\n"
        "with hooktrace.trace() as t:\n"
        "    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n"
        "        b = a * a\n"
        "    b.backward()\n"
        "print(ran, [t.trace.hook(e.hook).name for e in t.trace.hook_events()], a.grad.item())\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.split("\n")[0]
        == "['pack', 'pack', 'unpack', 'unpack'] ['pack', 'pack', 'unpack', 'unpack'] 4.0"
    )


CHECKER = ROOT / "scripts" / "check_torch_source.py"


def _check_source(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECKER), str(root)], capture_output=True, text=True, timeout=300
    )


def _copy_of_torch_sources(tmp_path: Path) -> Path:
    # only the files the checker reads, as a fetched checkout would hold them
    installed = Path(torch.__file__).parent.parent
    root = tmp_path / "src"
    for rel in sorted({rel for rel, _ in _checker_names()}):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((installed / rel).read_text(encoding="utf-8"), encoding="utf-8")
    return root


def _checker_names() -> list[tuple[str, str]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_torch_source", CHECKER)
    assert spec is not None and spec.loader is not None
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    signatures = [(rel, name) for rel, name, _ in checker.SIGNATURES]
    marks = [checker.COMPILE_MARK, checker.COMPILE_CONTEXT]
    return [*checker.NAMES, *checker.ATTRS, *checker.DYNAMO_NAMES, *checker.DYNAMO_ATTRS, *signatures, *marks]


def test_the_source_checker_passes_on_the_installed_torchs_sources(tmp_path: Path) -> None:
    done = _check_source(_copy_of_torch_sources(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok   nn.Module's hook-dict reads rewritten" in done.stdout
    assert "ok   Optimizer's hook-dict reads and step wrapper rewritten" in done.stdout
    assert done.stdout.splitlines()[-1].endswith(" passed, 0 failed")


@pytest.mark.parametrize(
    "rel, old, new, words",
    [
        (
            "torch/nn/modules/module.py",
            "self._forward_hooks.items()",
            "dict(self._forward_hooks).items()",
            "FAIL nn.Module's hook-dict reads rewritten",
        ),
        (
            "torch/optim/optimizer.py",
            "record_function(profile_name)",
            "record_function(name=profile_name)",
            "FAIL Optimizer's hook-dict reads and step wrapper rewritten",
        ),
        (
            "torch/utils/hooks.py",
            "def setup_output_hook(",
            "def setup_outputs_hook(",
            "FAIL torch/utils/hooks.py defines BackwardHook.setup_output_hook",
        ),
        (
            "torch/_dynamo/compiled_autograd.py",
            "def end_capture(self, outputs",
            "def end_capture(self, graph_outputs",
            "FAIL torch/_dynamo/compiled_autograd.py: AutogradCompilerInstance.end_capture takes the parameters",
        ),
        (
            "torch/_C/_dynamo/eval_frame.pyi",
            "def set_code_exec_strategy(",
            "def set_code_strategy(",
            "FAIL torch/_C/_dynamo/eval_frame.pyi defines set_code_exec_strategy",
        ),
    ],
    ids=["module-read", "optimizer-edit", "patched-name", "dynamo-signature", "dynamo-name"],
)
def test_the_source_checker_fails_where_a_rewrite_or_a_name_does_not_match(
    tmp_path: Path, rel: str, old: str, new: str, words: str
) -> None:
    root = _copy_of_torch_sources(tmp_path)
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert old in text  # still true of the torch this runs on
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    done = _check_source(root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert words in done.stdout
    assert done.stdout.splitlines()[-1].endswith(" passed, 1 failed")


def test_the_source_checker_says_its_usage_on_a_folder_without_torch(tmp_path: Path) -> None:
    done = _check_source(tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: usage:")


def test_the_package_range_and_the_refusal_say_the_same_versions() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"torch>=2.8,<2.16"' in text
    assert supported.SUPPORTED_TORCH == "2.8–2.15" and supported.OLDEST == (2, 8)
