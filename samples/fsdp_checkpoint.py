"""FSDP2 `fully_shard` + composable `checkpoint`: library hooks, prepended, on a one-rank gloo group.

Run:  hooktrace run samples/fsdp_checkpoint.py --steps 2

What to look for:
- `fully_shard` registers a forward pre-hook `FSDPState._pre_forward` with `prepend=True` and a
  forward hook `FSDPState._post_forward` on every sharded module (all-gather before forward,
  reshard after). Composable `checkpoint` registers a forward pre-hook and, with `prepend=True`,
  a forward hook. The tree shows the prepended ones with the `prepend` badge, `registered_at`
  inside torch/distributed/..., and `registered_by` the `fully_shard(...)` or `checkpoint(...)`
  line here.
- `log_pre`, registered on each block before the libraries, now runs after FSDP's pre-forward
  hook (prepended) but before checkpoint's (appended).
- Checkpointed blocks run their forward again during backward (phase `recompute`), so FSDP's
  pre-forward hook all-gathers again there; the recompute stops early (`_StopRecomputationError`
  on the `exit` events, raised and caught by PyTorch, not an error of the run).
- In backward, FSDP's `_pre_backward` tensor hooks on each block's output are registered during the
  forward of every step (new ids each step, badge-free `grad` lines, registered during the run).
The process group is a single rank over gloo on 127.0.0.1 (a free port), CPU only; it is created
only if none exists.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torch import nn

CALLS: list[str] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_one_rank_group() -> None:
    """A one-rank gloo process group on this machine, unless one is already initialised."""
    if dist.is_initialized():
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    for attempt in range(3):  # the free port may be taken between the probe and the bind
        os.environ["MASTER_PORT"] = str(_free_port())  # not an inherited one: it may be in use
        try:
            dist.init_process_group("gloo", rank=0, world_size=1)
            return
        except dist.DistNetworkError:
            if attempt == 2:
                raise


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def log_pre(module: nn.Module, args: tuple) -> None:
    CALLS.append("log_pre")


def make() -> tuple[nn.Module, torch.Tensor]:
    from torch.distributed._composable import checkpoint
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    init_one_rank_group()
    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (1,))
    for block in model.blocks:
        block.register_forward_pre_hook(log_pre)
        checkpoint(block)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.randn(4, 8)
