"""A forward hook raises in the second step."""

import torch

calls = [0]


def check_output(module, args, output):
    calls[0] += 1
    if calls[0] == 2:
        raise ValueError("output out of range")


model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
model[1].register_forward_hook(check_output)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
