"""CUDA: the same oracle on the GPU, where backward hooks run on autograd's device threads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import hooktrace
from tests.oracle import Zoo, assert_no_shims, snapshot_dicts

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SAMPLES = Path(__file__).parent.parent / "samples"


@needs_cuda
def test_cuda_order_threads_and_restore():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).cuda()
    zoo = Zoo()
    handles = [
        zoo.module(m[0], "forward_pre", "pre", prepend=True),
        zoo.module(m[0], "backward_pre", "bpre"),
        zoo.module(m[2], "backward", "bwd"),
        zoo.tensor(m[0].weight, "grad", "wgrad"),
        zoo.tensor(m[0].weight, "post_accumulate_grad", "wpost"),
    ]
    before = snapshot_dicts(m)
    with hooktrace.trace(m) as t:
        m(torch.randn(4, 8, device="cuda", requires_grad=True)).sum().backward()
        torch.cuda.synchronize()
    assert snapshot_dicts(m) == before
    assert_no_shims(snapshot_dicts(m))
    for h in handles:
        h.remove()
    assert zoo.traced(t.trace) == zoo.log
    assert t.trace.meta.device.startswith("cuda")
    forward_threads = {e.thread for e in t.trace.events if e.phase == "forward"}
    backward_threads = {e.thread for e in t.trace.events if e.phase == "backward"}
    assert len(forward_threads) == 1 and backward_threads  # CUDA backward runs on a device thread


@needs_cuda
def test_cli_device_cuda(tmp_path):
    out = tmp_path / "q.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hooktrace",
            "run",
            str(SAMPLES / "quickstart.py"),
            "--device",
            "cuda",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["meta"]["device"].startswith("cuda")
