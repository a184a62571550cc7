"""The script the `exec_untraced_steps` row runs, as `python` and as `hooktrace exec --start 10 --steps 2
--keep-running`: 20 hook-heavy training steps (150 x (Linear(64,64), ReLU), a pre-hook, two forward
hooks and a weight grad hook on each Linear, SGD); each step's CPU time (this thread's: a shared
machine's other jobs do not count) and wall time written to argv[1] as JSON. With argv[2] == "count":
each step's Python function calls and bytecodes instead (`sys.setprofile` / `sys.settrace` opcode
events: what runs in Python per step, the same on any machine, whatever its load)."""

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
cpu, wall, calls, opcodes = [], [], [], []
count = sys.argv[2:] == ["count"]
n = [0, 0]


def profile(frame, event, arg):
    if event == "call":
        n[0] += 1


def trace(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
        n[1] += 1
    return trace


for _ in range(20):
    n[:] = [0, 0]
    if count:
        sys.setprofile(profile)
        sys.settrace(trace)
    c0, t0 = time.thread_time(), time.perf_counter()
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    cpu.append(time.thread_time() - c0)
    wall.append(time.perf_counter() - t0)
    if count:
        sys.settrace(None)
        sys.setprofile(None)
    calls.append(n[0])
    opcodes.append(n[1])
with open(sys.argv[1], "w") as f:
    json.dump({"cpu": cpu, "wall": wall, "calls": calls, "opcodes": opcodes}, f)
