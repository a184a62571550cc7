"""Flags that must do what they say (issue 14), TARGET mistakes with a hint, and the optimizer step
(issue 16)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import hooktrace

from .test_cli import SAMPLES, invoke, restore_global_hooks, script, write  # noqa: F401
from .test_cli_errors import one_error_line

# -- --module, and the flags a format does not take ---------------------------------------------------


def test_module_root_label_selects_the_root(tmp_path: Path) -> None:
    saved = tmp_path / "t.json"
    assert invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(saved))[0] == 0
    code, root, err = invoke("render", str(saved), "--module", "<root>")
    assert code == 0 and err == ""
    assert "first_pre" in root and "log_pre" in root  # the whole model: everything is inside the root
    assert invoke("render", str(saved), "--module", "")[1] == root  # the root's path, as PyTorch names it


def test_an_unknown_module_exits_2_with_the_close_paths(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = one_error_line(["run", "samples/transformer.py", "--module", "layers.3"], capsys)
    assert code == 2 and "no module 'layers.3'" in line and "did you mean 'encoder.layers.3'" in line
    code, line = one_error_line(["run", str(SAMPLES / "quickstart.py"), "--module", "zzz"], capsys)
    assert code == 2 and "module paths are '<root>', '0'" in line


def test_tree_flags_with_a_format_that_ignores_them_get_a_note(tmp_path: Path) -> None:
    code, out, err = invoke(
        "run", str(SAMPLES / "quickstart.py"), "-f", "json", "--depth", "1", "--phase", "forward"
    )
    assert code == 0 and out.lstrip().startswith("{")
    assert "note: --depth, --phase not applied to json output, which holds the whole trace" in err
    code, _, err = invoke(
        "run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "x.dot"), "--module", "0"
    )
    assert code == 0 and "note: --module not applied to dot output (tree only)" in err
    code, _, err = invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "x.dot"), "--expand")
    assert code == 0 and "note" not in err  # DOT takes --expand
    code, _, err = invoke("run", str(SAMPLES / "quickstart.py"), "--depth", "1")
    assert code == 0 and "note" not in err


# -- TARGET mistakes ------------------------------------------------------------------------------------


def test_close_file_and_attribute_names_are_suggested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path / "model.py",
        "class Zoo:\n    def small(self): pass\n    def large(self): pass\n\ndef make(): pass\n",
    )
    code, line = one_error_line(["run", str(tmp_path / "modle.py")], capsys)
    assert code == 2 and "(did you mean" in line and "model.py?)" in line
    code, line = one_error_line(["run", f"{tmp_path / 'model.py'}:mkae"], capsys)
    assert code == 2 and "no attribute 'mkae' (did you mean 'make'?)" in line
    code, line = one_error_line(["run", f"{tmp_path / 'model.py'}:Zoo.big"], capsys)
    assert code == 2 and "Zoo has no attribute 'big' (its callable attributes: large, small)" in line


def test_a_sibling_file_that_a_package_target_cannot_import_is_named(tmp_path: Path) -> None:
    (tmp_path / "ht_sib_pkg").mkdir()
    write(tmp_path / "ht_sib_pkg" / "__init__.py", "")
    write(tmp_path / "ht_sib_pkg" / "cnn_ht.py", "from torch import nn\nNet = nn.Linear\n")
    write(
        tmp_path / "ht_sib_pkg" / "train.py",
        "import torch\nimport cnn_ht\n\ndef make():\n    return cnn_ht.Net(2, 2), torch.ones(2)\n",
    )
    proc = script("run", "ht_sib_pkg.train:make", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert "No module named 'cnn_ht'" in line and "install the missing package" not in line
    assert (
        "ht_sib_pkg/cnn_ht.py is beside the target" in line and "does not put its folder on sys.path" in line
    )
    assert "hooktrace run ht_sib_pkg/train.py:NAME" in line
    assert script("run", "ht_sib_pkg/train.py", cwd=tmp_path).returncode == 0  # as the hint says


def test_a_sibling_shadowed_by_another_module_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "json.py", "Net = None\n")  # `json` is the standard library's, imported long ago
    target = write(tmp_path / "uses_json.py", "from json import Net\n\ndef make(): pass\n")
    code, line = one_error_line(["run", str(target)], capsys)
    assert code == 2 and "json.py is beside the target, but the 'json' Python found is" in line
    assert "which shadows it" in line


def test_traceback_flag_drops_the_hint_that_points_to_it(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad_import.py", "raise KeyError('at import')\n")
    plain = script("run", str(bad))
    assert plain.stderr.strip().endswith("(--traceback shows where)")
    shown = script("run", str(bad), "--traceback")
    assert shown.returncode == 2 and "Traceback" in shown.stderr
    assert shown.stderr.strip().splitlines()[-1].endswith("fix the import")


# -- the optimizer step ---------------------------------------------------------------------------------

TRAINING = """
    import torch
    from torch import nn

    import hooktrace

    CALLS = []

    def make():
        model = nn.Linear(3, 1)
        model.register_forward_hook(lambda m, a, o: CALLS.append("forward"))
        model.weight.register_post_accumulate_grad_hook(lambda p: CALLS.append("accumulated"))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.register_step_pre_hook(lambda o, a, k: CALLS.append("step"))
        opt.register_step_post_hook(lambda o, a, k: CALLS.append(("grad after step", model.weight.grad is not None)))
        return hooktrace.Target(model, inputs=torch.ones(2, 3), optimizer=opt)

    def bare():
        model = nn.Linear(3, 1)
        model.register_forward_hook(lambda m, a, o: CALLS.append(("weight", m.weight.detach().clone())))
        return model, torch.ones(2, 3)
"""


def test_each_step_runs_forward_backward_optimizer_step_and_zero_grad(tmp_path: Path) -> None:
    target = write(tmp_path / "training.py", TRAINING)
    code, _, err = invoke("run", str(target), "--steps", "2", "-o", str(tmp_path / "t.json"))
    assert code == 0, err
    calls = sys.modules["training"].CALLS
    one = ["forward", "accumulated", "step", ("grad after step", True)]
    assert calls == one + one
    assert hooktrace.load(tmp_path / "t.json").meta.steps == 2


def test_optimizer_flag_updates_the_parameters_between_steps(tmp_path: Path) -> None:
    target = write(tmp_path / "training_flag.py", TRAINING)
    code, _, err = invoke("run", f"{target}:bare", "--steps", "2", "--optimizer", "adam", "-f", "json")
    assert code == 0, err
    (_, w0), (_, w1) = sys.modules["training_flag"].CALLS
    assert not torch.equal(w0, w1)  # Adam moved the weights after step 0
    code, _, err = invoke("run", f"{target}:bare", "--optimizer", "adam", "--no-backward", "-f", "json")
    assert code == 0 and "optimizer step skipped (--no-backward)" in err
