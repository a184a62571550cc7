"""A forward hook registered inside the training loop; `--remove` removes it at the end of each step."""

import sys

import torch
from oracle_log import STEP, record


def log_output(module, args, output):
    record("log_output")


model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    handle = model.register_forward_hook(log_output)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    if "--remove" in sys.argv:
        handle.remove()
    STEP[0] += 1
