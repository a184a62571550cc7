"""Sends itself the signal named by argv[1] (SIGINT or SIGTERM) in the forward of its third step."""

import os
import signal
import sys

import torch

sig = getattr(signal, sys.argv[1])


def maybe_stop(module, args, output):
    if step == 2:
        os.kill(os.getpid(), sig)


model = torch.nn.Linear(2, 1)
model.register_forward_hook(maybe_stop)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):  # noqa: B007  (maybe_stop reads it)
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
print("not stopped", flush=True)
