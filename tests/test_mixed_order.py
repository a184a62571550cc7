"""samples/mixed_hooks.py: a model with many hook kinds at once (module, global, prepend, with_kwargs,
always_call, legacy, tensor, post-accumulate, node, multi-grad, end-of-backward, saved-tensor,
checkpoint recompute, registration, state-dict, optimizer and its state-dict hooks), two steps.

The traced order is what the hooks themselves recorded, and its order file is torch 2.13.0's (the
golden file, made there) on every torch this suite runs on: README "Torch versions" says which
were run. A torch whose PyTorch fires these hooks in another order is named in VERSIONED with the
fact that makes it differ, and the order file is then compared with what that fact predicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from hooktrace import kinds, supported

from .test_cli import invoke
from .test_samples import at_root, run_sample  # noqa: F401 - the fixture: paths relative to the root

SAMPLE = "samples/mixed_hooks.py"
# (major, minor) -> (what PyTorch does differently there, the change that turns that torch's order
# file into 2.13.0's).
# None so far: 2.8.0 and 2.14.1 gave 2.13.0's order file byte for byte (README "Torch versions").
VERSIONED: dict[tuple[int, int], tuple[str, Callable[[str], str]]] = {}
# every kind the sample registers, each expected to fire in both steps
KINDS = {
    kinds.K.forward_pre, kinds.K.forward, kinds.K.backward_pre, kinds.K.backward, kinds.K.backward_legacy,
    kinds.K.grad, kinds.K.post_accumulate_grad, kinds.K.node_pre, kinds.K.node, kinds.K.multi_grad,
    kinds.K.final_callback, kinds.K.pack, kinds.K.unpack, kinds.K.buffer_registration,
    kinds.K.module_registration, kinds.K.state_dict_pre, kinds.K.state_dict, kinds.K.load_state_dict_pre,
    kinds.K.load_state_dict_post, kinds.K.optimizer_step_pre, kinds.K.optimizer_step_post,
    kinds.K.optimizer_state_dict_pre, kinds.K.optimizer_state_dict, kinds.K.optimizer_load_state_dict_pre,
    kinds.K.optimizer_load_state_dict_post,
}  # fmt: skip


def test_every_hook_call_is_traced_in_the_order_the_hooks_recorded(tmp_path: Path) -> None:
    trace, calls = run_sample("mixed_hooks", tmp_path, "--steps", "2")
    own = [
        trace.hook(e.hook)
        for e in trace.hook_events()
        if (trace.hook(e.hook).defined_at or "").startswith(SAMPLE)
    ]
    assert [h.name.rsplit(".", 1)[-1] for h in own] == calls
    assert len(calls) > 60
    for step in (0, 1):
        fired = {trace.hook(e.hook).kind for e in trace.hook_events() if e.step == step}
        assert KINDS <= fired, sorted(KINDS - fired)


def test_the_order_file_is_torch_2_13s(tmp_path: Path, golden: Callable[[str, str], None]) -> None:
    out = tmp_path / "mixed_hooks.txt"
    code, _, err = invoke("run", SAMPLE, "--steps", "2", "--format", "order", "-o", str(out))
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    release = supported.release(str(torch.__version__))
    if release in VERSIONED:
        why, change = VERSIONED[release]
        assert why.strip()
        text = change(text)
    golden("order/mixed_hooks.txt", text)
