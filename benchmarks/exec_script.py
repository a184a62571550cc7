"""The script the `exec_untraced_steps` row runs, as `python` and as `hooktrace exec --start 10 --steps 2
--keep-running`: 20 hook-heavy training steps (150 x (Linear(64,64), ReLU), a pre-hook, two forward
hooks and a weight grad hook on each Linear, SGD), each step's wall time written to argv[1] as JSON."""

import json
import sys
import time

import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
layers = []
for _ in range(150):
    fc = nn.Linear(64, 64)
    fc.register_forward_pre_hook(lambda m, a: None)
    fc.register_forward_hook(lambda m, a, o: None)
    fc.register_forward_hook(lambda m, a, o: None)
    fc.weight.register_hook(lambda g: None)
    layers += [fc, nn.ReLU()]
model = nn.Sequential(*layers)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(32, 64)
times = []
for _ in range(20):
    t0 = time.perf_counter()
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    times.append(time.perf_counter() - t0)
with open(sys.argv[1], "w") as f:
    json.dump(times, f)
