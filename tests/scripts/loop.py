"""A plain training loop: argparse, an LR scheduler, gradient accumulation (an optimizer step every
--accum backward calls); hooks of every common kind record themselves (oracle_log)."""

import argparse
import sys

import torch
from oracle_log import STEP, record

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--say", default="")
args = parser.parse_args()
if args.say:
    print(args.say, sys.argv[1:], __name__, flush=True)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def first_pre(module, inputs):
    record("first_pre")


def fc1_out(module, inputs, output):
    record("fc1_out")


def fc2_backward(module, grad_input, grad_output):
    record("fc2_backward")


def weight_grad(grad):
    record("weight_grad")


def global_pre(module, inputs):
    record("global_pre")


def after_step(optimizer, args, kwargs):
    record("after_step")


def loss_out(module, inputs, output):
    record("loss_out")


torch.manual_seed(0)
model = Net()
loss_fn = torch.nn.MSELoss()
model.fc1.register_forward_pre_hook(first_pre, prepend=True)
model.fc1.register_forward_hook(fc1_out)
model.fc2.register_full_backward_hook(fc2_backward)
model.fc1.weight.register_hook(weight_grad)
loss_fn.register_forward_hook(loss_out)
handle = torch.nn.modules.module.register_module_forward_pre_hook(global_pre)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer.register_step_post_hook(after_step)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)

for i in range(args.steps * args.accum):
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    loss = loss_fn(model(x), y) / args.accum
    loss.backward()
    if (i + 1) % args.accum == 0:
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        STEP[0] += 1
handle.remove()
print("finished", STEP[0], flush=True)
