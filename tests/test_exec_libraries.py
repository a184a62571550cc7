"""`hooktrace exec` on real training stacks, really run (random weights, data made in code; nothing
downloads): Hugging Face `Trainer`, accelerate, PyTorch Lightning. Each script's hooks record
themselves (tests/scripts/oracle_log.py); the traced order must equal that record in the window."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hooktrace

SCRIPTS = Path(__file__).parent / "scripts"


def _exec(tmp_path: Path, *args: str) -> tuple[hooktrace.Trace, list[str], subprocess.CompletedProcess]:
    """Run `hooktrace exec ARGS -o trace.json` in tests/scripts; the trace and the hooks' log by step."""
    log = tmp_path / "hooks.log"
    env = dict(os.environ, HOOKTRACE_TEST_LOG=str(log), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "exec", "-o", str(tmp_path / "trace.json"), *args],
        cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in log.read_text().splitlines()]
    return hooktrace.load(tmp_path / "trace.json"), lines, done


def _user_hooks(trace: hooktrace.Trace, names: set[str]) -> list[tuple[str, str]]:
    by_id = {h.id: h.name for h in trace.hooks}
    return [(by_id[e.hook], e.phase) for e in trace.events if e.type == "hook" and by_id[e.hook] in names]


def _in_steps(lines: list[list[str]], *steps: int) -> list[str]:
    return [name for step, name in lines if int(step) in steps]


@pytest.mark.slow
def test_hf_trainer_with_gradient_checkpointing(tmp_path):
    pytest.importorskip("transformers")  # a dev extra; skips in a user environment without it
    trace, lines, done = _exec(tmp_path, "--start", "2", "--steps", "1", "hf_trainer.py")
    names = {"layer0_pre", "mlp_out", "norm_backward", "embed_grad"}
    traced = _user_hooks(trace, names)
    assert (
        [name for name, _ in traced]
        == _in_steps(lines, 2)
        == ["layer0_pre", "mlp_out", "norm_backward", "embed_grad"]
    )
    assert "trained" not in done.stderr  # stopped after the window: max_steps=4 never reached
    assert "traced step 2" in done.stderr
    phases = {e.phase for e in trace.events}
    assert "recompute" in phases  # gradient checkpointing re-ran the layers' forward in backward
    hooks = {h.name: h for h in trace.hooks}
    assert hooks["layer0_pre"].with_kwargs and hooks["layer0_pre"].module == "model.layers.0"
    assert hooks["embed_grad"].tensor == "model.embed_tokens.weight"
    assert any(
        h.kind == "pack" and h.registered_at.startswith("torch/utils/checkpoint.py") for h in trace.hooks
    )


@pytest.mark.slow
def test_accelerate_prepared_loop(tmp_path):
    trace, lines, done = _exec(tmp_path, "--start", "2", "--steps", "2", "accelerate_loop.py")
    traced = _user_hooks(trace, {"first_pre", "head_backward", "before_step"})
    assert [name for name, _ in traced] == _in_steps(lines, 2, 3)
    assert traced[:3] == [
        ("first_pre", "forward"),
        ("head_backward", "backward"),
        ("before_step", "optimizer"),
    ]
    assert "done" not in done.stdout


@pytest.mark.slow
def test_lightning_fit(tmp_path):
    pytest.importorskip("pytorch_lightning")  # a dev extra; skips without it
    trace, lines, _done = _exec(tmp_path, "--start", "2", "lightning_fit.py")
    traced = _user_hooks(trace, {"body_out", "head_backward_pre"})
    assert [name for name, _ in traced] == _in_steps(lines, 2)
    # the forward runs in the optimizer's closure, inside optimizer.step(): still the forward phase
    assert traced == [("body_out", "forward"), ("head_backward_pre", "backward")]
    assert [m.path for m in trace.modules][:3] == ["", "body", "head"]
