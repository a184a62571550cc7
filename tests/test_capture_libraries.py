"""Real library hooks: FSDP2 fully_shard + composable checkpoint (1-rank gloo), quantization prepare."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

import hooktrace
from tests.oracle import Zoo, assert_no_shims, snapshot_dicts


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_fsdp2_with_composable_checkpoint_order_flags_and_restore(gloo_one_rank):
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import fully_shard

    zoo = Zoo()
    with hooktrace.trace() as t:
        torch.manual_seed(0)
        m = nn.Sequential(Block(), Block())
        for i, block in enumerate(m):
            zoo.module(block, "forward_pre", f"user_pre{i}")
            zoo.module(block, "forward", f"user_fwd{i}")
            checkpoint(block)
            fully_shard(block)
        fully_shard(m)
        t.attach(m)
        for step in range(2):
            if step:
                t.mark_step()
            zoo.in_backward = False
            out = m(torch.randn(4, 8))
            zoo.in_backward = True
            out.sum().backward()
    after = snapshot_dicts(m)
    assert_no_shims(after)
    trace = t.trace
    assert zoo.traced(trace) == zoo.log
    pre_forward = [h for h in trace.hooks if h.name == "FSDPState._pre_forward"]
    assert {h.module for h in pre_forward} == {"", "0", "1"}
    for h in pre_forward:
        assert (h.prepend, h.prepend_source, h.with_kwargs) == (True, "registration", True)
        assert h.registered_at.startswith("torch/distributed/fsdp/")
        assert h.registered_by.startswith("tests/test_capture_libraries.py")
    ckpt = [h for h in trace.hooks if h.name == "checkpoint.<locals>.forward_hook"]
    assert ckpt and all(h.prepend_source == "registration" for h in ckpt)
    # FSDP's pre-forward fires before the user's pre-hook, which was registered first
    first_pre = [
        trace.hook(e.hook).name
        for e in trace.events
        if e.type == "hook" and e.module == "0" and e.kind == "forward_pre" and e.phase == "forward"
    ]
    assert first_pre[:2] == ["FSDPState._pre_forward", "hook_user_pre0"]
    # checkpoint re-ran forward hooks during backward, on both steps
    recompute_steps = {e.step for e in trace.events if e.phase == "recompute" and e.type == "hook"}
    assert recompute_steps == {0, 1}
    assert any(s.rule == "recompute" for s in trace.surprises)
    # FSDP's pre-backward hooks on outputs are registered during the run, every step
    pre_backward = [h for h in trace.hooks if h.name == "FSDPState._pre_backward"]
    assert pre_backward and all(h.scope == "tensor" and h.registered_during_run for h in pre_backward)
    assert all(h.tensor.startswith("output of") for h in pre_backward)


def test_quantization_prepare_observers_flagged_prepend():
    from torch.ao.quantization import QuantStub, get_default_qconfig, prepare

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = QuantStub()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.quant(x))

    zoo = Zoo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace() as t:
            m = Net().eval()
            zoo.module(m.fc, "forward", "user_fwd")
            m.qconfig = get_default_qconfig("fbgemm")
            prepare(m, inplace=True)
            t.attach(m)
            with torch.no_grad():
                m(torch.randn(2, 4))
    trace = t.trace
    assert zoo.traced(trace) == zoo.log == ["user_fwd"]
    observers = [h for h in trace.hooks if h.name == "_observer_forward_hook"]
    assert {h.module for h in observers} == {"quant", "fc"}
    for h in observers:
        assert (h.prepend, h.prepend_source) == (True, "registration")
        assert h.registered_at.startswith("torch/ao/quantization/")
        # through torch.ao's @deprecated wrapper, to the line that called prepare()
        assert h.registered_by.startswith("tests/test_capture_libraries.py")
    fc_order = [trace.hook(e.hook).name for e in trace.events if e.type == "hook" and e.module == "fc"]
    assert fc_order == ["_observer_forward_hook", "hook_user_fwd"]
    # the observer submodules prepare() added are named in the module table
    assert "fc.activation_post_process" in {m.path for m in trace.modules}
    assert_no_shims(snapshot_dicts(m))
