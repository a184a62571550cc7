"""Inference only: no optimizer ever steps."""

import torch
from oracle_log import STEP, record


def seen(module, args, output):
    record("seen")


model = torch.nn.Linear(2, 1)
model.register_forward_hook(seen)
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(1, 2))
        STEP[0] += 1
