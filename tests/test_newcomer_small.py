"""Issue 35, item 8: `exec --help` without typer's `<list[str]>`; `--depth` counted from `--module`'s
module; `-o` says where the tree is; the spread of step times under the tree."""

from __future__ import annotations

import re
from pathlib import Path

from hooktrace.render.tree import tree_text
from tests.test_render_fit import traced

from .test_cli import SAMPLES, invoke


def test_exec_help_names_the_script_as_it_is_typed() -> None:
    code, out, _ = invoke("exec", "--help")
    assert code == 0
    assert "<list[str]>" not in out and "[SCRIPT.py [ARGS]...]..." not in out
    assert "exec [OPTIONS] SCRIPT.py [ARGS]..." in " ".join(out.split())


def test_depth_counts_from_the_module_given() -> None:
    quickstart = str(SAMPLES / "quickstart.py")
    code, out, _ = invoke("run", quickstart, "--module", "0", "--depth", "0", "--phase", "forward")
    assert code == 0
    assert "#5 forward_pre" in out, out  # the module's own hook, at depth 0
    assert "#7 forward_pre" not in out and "deeper than depth 0" in out  # its submodules' calls folded
    code, out, _ = invoke("run", quickstart, "--module", "0", "--depth", "1", "--phase", "forward")
    assert "#7 forward_pre" in out and "#10 forward_pre" in out
    code, whole, _ = invoke("run", quickstart, "--depth", "1", "--phase", "forward")
    assert "#1 forward_pre" in whole and "#5 forward_pre" not in whole  # without --module: from the phase


def test_o_says_where_the_tree_is(tmp_path: Path) -> None:
    saved = tmp_path / "run.json"
    code, out, err = invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(saved))
    assert code == 0 and out == ""
    assert f"the tree: hooktrace render {saved}" in err
    code, _, err = invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(tmp_path / "run.svg"), "-f", "dot")
    assert code == 0 and "no tree printed with -o" in err


def test_the_spread_of_step_times_is_shown() -> None:
    trace = traced(2)
    assert "steps " not in tree_text(trace, width=200)  # one step: nothing to spread
    import torch

    import hooktrace

    model = torch.nn.Linear(2, 2)
    model.register_forward_hook(lambda m, a, o: None)
    with hooktrace.trace(model) as t:
        for _ in range(3):
            model(torch.randn(1, 2))
            t.mark_step()
    text = " ".join(tree_text(t, width=200).split())
    assert re.search(r"steps \S+–\S+ \(median \S+\)", text), text
