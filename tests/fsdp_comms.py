"""FSDP communication hooks that record their own names (tests/test_capture_fsdp_comm.py), and the
two-rank run of FSDP2's custom collectives on gloo, each rank traced and untraced:

    python -m torch.distributed.run --nproc-per-node 2 tests/fsdp_comms.py OUT_DIR

writes OUT_DIR/rank{r}.json: the hooks' own record, hooktrace's FSDP events and the gradients.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard import _fsdp_api

# FSDP2's custom collectives (`set_custom_all_gather` / `set_custom_reduce_scatter`) are new in torch 2.9
CUSTOM_COMMS = hasattr(_fsdp_api, "AllGather")
NO_CUSTOM_COMMS = "FSDP2's set_custom_all_gather / set_custom_reduce_scatter are new in torch 2.9"
_AllGather: Any = getattr(_fsdp_api, "AllGather", object)
_ReduceScatter: Any = getattr(_fsdp_api, "ReduceScatter", object)

FSDP_KINDS = ("fsdp_all_reduce", "fsdp_all_gather", "fsdp_reduce_scatter", "fsdp_comm")


def _entry(name: str, engine: bool) -> Any:
    """What a hook records: its name, with whether autograd's engine runs it when `engine`."""
    return (name, torch._C._current_graph_task_id() != -1) if engine else name


def named(log: list[Any], name: str, engine: bool = False) -> Callable[..., None]:
    def hook(*args: Any) -> None:
        log.append(_entry(name, engine))

    hook.__name__ = hook.__qualname__ = name
    return hook


class AllGather(_AllGather):
    """A custom all-gather gloo can run: `all_gather` into the output's chunks."""

    def __init__(self, log: list[Any], name: str, engine: bool = False) -> None:
        self.log, self.name, self.engine, self.allocations = log, name, engine, 0

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        self.allocations += 1
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Optional[Any]:
        self.log.append(_entry(self.name, self.engine))
        dist.all_gather(list(output_tensor.chunk(group.size())), input_tensor, group=group)
        return None


class ReduceScatter(_ReduceScatter):
    """A custom reduce-scatter gloo can run: `all_reduce`, then this rank's chunk."""

    def __init__(self, log: list[Any], name: str, engine: bool = False) -> None:
        self.log, self.name, self.engine, self.allocations = log, name, engine, 0

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        self.allocations += 1
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Optional[Any]:
        self.log.append(_entry(self.name, self.engine))
        total = input_tensor.clone()
        dist.all_reduce(total, group=group)
        if op == dist.ReduceOp.AVG:
            total /= group.size()
        output_tensor.copy_(total.chunk(group.size())[group.rank()])
        return None


def fsdp_events(trace: Any) -> list[tuple[str, str, str, Optional[str]]]:
    """(hook name, kind, phase, module) of every FSDP comm-hook event, in order."""
    return [
        (trace.hook(e.hook).name, e.kind, e.phase, e.module)
        for e in trace.hook_events()
        if e.kind in FSDP_KINDS
    ]


def _run(traced: bool) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    import hooktrace

    torch.manual_seed(0)  # the same model on both ranks; each rank its own input
    log: list[Any] = []
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    fully_shard(m[0])
    fully_shard(m)
    m[0].set_all_reduce_hook(named(log, "ar_block", engine=True))
    x = torch.randn(3, 4) + dist.get_rank()
    with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
        for module in (m[0], m):
            module.set_custom_all_gather(AllGather(log, "ag", engine=True))
            module.set_custom_reduce_scatter(ReduceScatter(log, "rs", engine=True))
        m.set_all_reduce_hook(named(log, "ar_root", engine=True))
        for step in range(2):
            if step and traced:
                t.mark_step()
            m(x).sum().backward()
    out: dict[str, Any] = {"log": log, "grads": [p.grad.full_tensor().tolist() for p in m.parameters()]}
    if traced:
        out["events"] = fsdp_events(t.trace)
        out["never_fired"] = [
            s.message for s in t.trace.surprises if s.rule == "never-fired" and "fsdp" in s.message
        ]
    return out


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    plain, traced = _run(False), _run(True)
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps({"plain": plain, "traced": traced}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
