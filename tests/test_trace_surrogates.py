"""A lone surrogate ("\\ud800": a Python str may hold one, UTF-8 cannot) in any text of a trace: the
trace saves (plain and gzip), loads back equal, and renders; `run -o` writes it. Saved as the JSON
escape `\\ud800`, read back as the same code point (see README, "Trace files")."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hooktrace.io import dumps, loads
from hooktrace.schema import Surprise, Trace, TraceFormatError
from hooktrace.validate import from_dict, load
from tests.trace_samples import sample

LONE = ["\ud800", "\udfff", "\udc80", "a\udbffb", "\udc00\ud800"]  # high, low, reversed pair


def _with(text: str, where: str) -> Trace:
    t = sample()
    if where == "hook name":
        t.hooks[0].name = f"pre{text}"
    elif where == "module path":
        t.modules[1].path = t.hooks[0].module = t.hooks[1].module = f"fc{text}"
        t.events = [e._replace(module=f"fc{text}") if e.module == "fc" else e for e in t.events]
    elif where == "module type":
        t.modules[1].type = f"Lin{text}"
    elif where == "target":
        t.meta.target = f"m{text}.py:make"
    elif where == "error":
        t.events = [e._replace(error=f"ValueError: {text}") if e.error else e for e in t.events]
    elif where == "surprise message":
        t.surprises[0] = Surprise("replaced-value", f"msg {text}", [3], [1])
    elif where == "tensor":
        t.hooks[1].tensor = f"fc.weight{text}"
    return t


WHERE = ["hook name", "module path", "module type", "target", "error", "surprise message", "tensor"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("text", LONE, ids=[ascii(s) for s in LONE])
@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_a_lone_surrogate_saves_and_loads_back_the_same(
    tmp_path: Path, where: str, text: str, name: str
) -> None:
    t = _with(text, where)
    path = tmp_path / name
    t.save(path)
    back = load(path)
    assert back.to_dict() == t.to_dict()
    assert [dataclasses.astuple(h) for h in back.hooks] == [dataclasses.astuple(h) for h in t.hooks]
    assert back.events == t.events
    assert from_dict(json.loads(t.to_json())).to_dict() == t.to_dict()  # any JSON reader agrees
    if name == "t.json":  # the JSON escape, in a file that is valid UTF-8
        lone = next(c for c in text if "\ud800" <= c <= "\udfff")
        assert f"\\u{ord(lone):04x}" in path.read_bytes().decode("utf-8")


def test_a_surrogate_pair_written_as_two_code_points_reads_back_as_its_character() -> None:
    """What cannot round-trip: JSON has no way to tell "\\ud83d\\ude00" from "😀"."""
    assert loads(dumps({"a": "\ud83d\ude00"})) == {"a": "\U0001f600"}


def test_what_is_not_json_stays_refused_next_to_a_surrogate_escape() -> None:
    for bad in (b'{"a": NaN, "b": "\\ud800"}', b"[" * 5000 + b'"\\ud800"', b'"\\ud800', b'"\\ud800" x'):
        with pytest.raises(ValueError):
            loads(bad)


FACTORY = """
import torch
from torch import nn


def make():
    model = nn.Sequential()
    model.add_module("sub\\ud800", nn.Linear(2, 2))

    def hook(module, args):
        if RAISE:
            raise RuntimeError("bad \\udc80 message")

    hook.__qualname__ = "pre\\udfffhook"
    model[0].register_forward_pre_hook(hook)
    return model, torch.randn(1, 2)
"""


def test_run_writes_renders_and_checks_a_trace_with_lone_surrogates(tmp_path: Path) -> None:
    raises = True  # in the hook's name, its module's path and the exception's message
    factory = tmp_path / "surr.py"
    factory.write_text(f"RAISE = {raises}\n" + FACTORY)
    script = str(Path(sys.executable).with_name("hooktrace"))
    out = tmp_path / "s.json.gz"
    run = subprocess.run([script, "run", str(factory), "-o", str(out)], capture_output=True, text=True)
    assert run.returncode == (1 if raises else 0), run.stderr
    assert "Traceback" not in run.stderr and "error: hooktrace stopped" not in run.stderr
    trace = load(out)
    assert {h.name for h in trace.hooks} == {"pre\udfffhook"}
    assert [m.path for m in trace.modules] == ["", "sub\ud800"]
    if raises:
        assert any(e.error == "RuntimeError: bad \udc80 message" for e in trace.events)
    shown = subprocess.run([script, "render", str(out)], capture_output=True, text=True)
    assert shown.returncode == 0 and "pre\\udfffhook" in shown.stdout and "sub\\ud800" in shown.stdout
    check = subprocess.run([script, "run", str(factory), "--check", str(out)], capture_output=True, text=True)
    assert check.returncode == (1 if raises else 0) and "same hook order" in check.stderr


def test_an_encoded_surrogate_that_is_not_utf8_is_still_refused(tmp_path: Path) -> None:
    """The nearest case that must still fail: bytes that are not UTF-8 at all."""
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"format": "hooktrace.trace", "x": "\xed\xa0\x80"}')  # CESU-8 of U+D800
    with pytest.raises(TraceFormatError):
        load(path)
