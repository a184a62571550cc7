"""Steps twice, then exits with code 3."""

import sys

import torch

model = torch.nn.Linear(2, 1)
model.register_forward_hook(lambda m, a, o: None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
sys.exit(3)
