"""DDP on gloo with a communication hook, as torchrun runs it; `--diverge` adds a hook on rank 1 only."""

import argparse

import torch
import torch.distributed as dist
from oracle_log import STEP, record
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--diverge", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def fc1_out(module, inputs, output):
    record("fc1_out")


def fc2_backward_pre(module, grad_output):
    record("fc2_backward_pre")


def allreduce_logged(state, bucket):
    record("allreduce_logged")
    return default_hooks.allreduce_hook(state, bucket)


def rank1_only(module, inputs, output):
    record("rank1_only")


def after_step(optimizer, args, kwargs):
    record("after_step")


model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model[0].register_forward_hook(fc1_out)
model[2].register_full_backward_pre_hook(fc2_backward_pre)
ddp = DistributedDataParallel(model)
ddp.register_comm_hook(dist.group.WORLD, allreduce_logged)
if args.diverge and rank == 1:
    model[2].register_forward_hook(rank1_only)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
optimizer.register_step_post_hook(after_step)
try:
    for _ in range(args.steps):
        x = torch.randn(5, 4, requires_grad=True)
        ddp(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        STEP[0] += 1
finally:
    dist.destroy_process_group()
print(f"rank {rank} finished", flush=True)
