"""Run as `-m pkg.train`: a package module that imports a sibling relatively."""

import sys

import torch
from oracle_log import STEP

from .model import make

model = make()
opt = torch.optim.Adam(model.parameters())
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    STEP[0] += 1
print("module", __name__, __package__, flush=True)
