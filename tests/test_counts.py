"""One vocabulary and the same numbers everywhere (issue 26, item 2): hooks registered, hooks that
fired, hook calls, module calls — in the tree's summary, the `wrote` line, the DOT/SVG title and
the JSON document, on real runs with several steps; "hooks fired" does not grow with --steps."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import hooktrace
from hooktrace.analysis.counts import Counts, count
from hooktrace.render.tree import tree_text

from .test_cli import SAMPLES, invoke, restore_global_hooks, small_trace, write  # noqa: F401

PHRASE = re.compile(r"(\d+) hooks? registered, (\d+) fired, (\d+) hook calls?, (\d+) module calls?")

# Hooks log their own names; `grad_of_act` is registered anew on the activation in every forward
# (one hook, whatever the steps); `never` sits on a container, which PyTorch never calls.
RECORDING = """
import os
import torch
from torch import nn

def rec(name):
    def hook(*args, **kwargs):
        with open(os.environ["HOOK_LOG"], "a") as f:
            f.write(name + "\\n")
    hook.__qualname__ = name
    return hook

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)
        self.unused = nn.ModuleList()

    def forward(self, x):
        h = self.act(self.fc(x))
        h.register_hook(rec("grad_of_act"))
        return self.out(h)

def make():
    torch.manual_seed(0)
    m = Net()
    m.fc.register_forward_pre_hook(rec("fc_pre"))
    m.fc.register_forward_hook(rec("fc_post"))
    m.out.register_full_backward_hook(rec("out_backward"))
    m.unused.register_forward_hook(rec("never"))
    return m, torch.randn(2, 4)
"""

# A hook registered in every forward and never removed: they pile up, each one a hook of its own.
LEAKING = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.fc.register_forward_hook(lambda m, a, o: None)
        return self.fc(x)

def make():
    return Net(), torch.randn(2, 4)
"""


def _numbers(text: str) -> tuple[int, ...]:
    found = {tuple(int(x) for x in m.groups()) for m in PHRASE.finditer(text)}
    assert len(found) == 1, f"expected one set of counts, found {found} in:\n{text}"
    return found.pop()


def _json_counts(path: Path) -> tuple[int, int]:
    """(hook calls, module calls) read from the JSON document itself, not through hooktrace.Trace."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    types = doc["events"]["tables"]["type"]
    column = [types[i] for i in doc["events"]["columns"]["type"]]
    return column.count("hook"), column.count("enter")


def _everywhere(target: str, steps: int, tmp_path: Path) -> tuple[int, ...]:
    """The counts of one run, checked equal in every output; returned once."""
    out = tmp_path / f"run{steps}.json"
    code, stdout, stderr = invoke("run", target, "--steps", str(steps), "-o", str(out))
    assert code == 0, stderr
    numbers = _numbers(stderr)  # the `wrote` line
    assert _numbers(invoke("render", str(out))[1]) == numbers  # the tree's summary line
    code, _, stderr = invoke("render", str(out), "-o", str(tmp_path / "run.dot"))
    assert code == 0 and _numbers(stderr) == numbers
    assert _numbers((tmp_path / "run.dot").read_text(encoding="utf-8")) == numbers  # the graph's title
    trace = hooktrace.load(out)
    assert _numbers(tree_text(trace)) == numbers  # the Python API's tree
    assert numbers[2:] == _json_counts(out)
    c = count(trace)
    assert (c.registered, c.fired, c.hook_calls, c.module_calls) == numbers
    if shutil.which("dot"):
        code, _, stderr = invoke("render", str(out), "-o", str(tmp_path / "run.svg"))
        assert code == 0 and _numbers(stderr) == numbers
        assert _numbers((tmp_path / "run.svg").read_text(encoding="utf-8")) == numbers
    return numbers


def test_recording_model_counts_agree_with_what_the_hooks_saw(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    model = write(tmp_path / "recording.py", RECORDING)
    for steps in (1, 3):
        log = tmp_path / f"log{steps}.txt"
        monkeypatch.setenv("HOOK_LOG", str(log))
        registered, fired, hook_calls, module_calls = _everywhere(f"{model}:make", steps, tmp_path)
        seen = log.read_text().split()
        assert hook_calls == len(seen)  # every call the hooks saw, and no other
        assert fired == len(set(seen)) == 4  # the per-step tensor hook is one hook, at any --steps
        assert registered == 5  # and `never`, on a container
        assert module_calls == 4 * steps  # Net, fc, act, out


def test_hooks_that_pile_up_count_one_each(tmp_path: Path) -> None:
    model = write(tmp_path / "leaking.py", LEAKING)
    for steps in (1, 3):
        registered, fired, hook_calls, _ = _everywhere(f"{model}:make", steps, tmp_path)
        assert registered == fired == steps  # step k runs k + 1 of them
        assert hook_calls == steps * (steps + 1) // 2


@pytest.mark.parametrize("sample", ["quickstart", "checkpoint_recompute", "saved_tensors", "training_step"])
def test_samples_counts_agree_and_do_not_grow_with_steps(sample: str, tmp_path: Path) -> None:
    one = _everywhere(f"{SAMPLES / sample}.py", 1, tmp_path)
    three = _everywhere(f"{SAMPLES / sample}.py", 3, tmp_path)
    assert three[:2] == one[:2]  # the same hooks (checkpoint's per-step saved-tensor hooks included)
    assert three[2:] == (3 * one[2], 3 * one[3])  # three times the calls


def test_one_of_each_is_singular() -> None:
    trace = small_trace()
    assert count(trace) == Counts(registered=1, fired=1, hook_calls=1, module_calls=1, modules=1, steps=1)
    text = tree_text(trace)
    assert "1 hook registered, 1 fired, 1 hook call, 1 module call, 1 module, 0 surprises" in text
    assert "1 hooks" not in text and "1 hook calls" not in text


def test_a_filtered_tree_says_how_much_of_the_trace_it_shows(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    code, _, stderr = invoke("run", str(SAMPLES / "quickstart.py"), "-o", str(out))
    assert code == 0
    _, stdout, _ = invoke("render", str(out), "--phase", "backward")
    assert _numbers(stdout) == _numbers(stderr)  # the whole trace's counts, as the `wrote` line said
    backward = [e for e in hooktrace.load(out).events if e.phase == "backward" and e.type == "hook"]
    assert backward and f"shown: {len(backward)} hook calls, 0 module calls" in stdout
