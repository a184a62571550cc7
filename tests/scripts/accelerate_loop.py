"""An `accelerate` script: `Accelerator().prepare(model, optimizer, dataloader)`, `accelerator.backward`."""

import torch
from accelerate import Accelerator
from oracle_log import STEP, record


def first_pre(module, args):
    record("first_pre")


def head_backward(module, grad_input, grad_output):
    record("head_backward")


def before_step(optimizer, args, kwargs):
    record("before_step")


torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
model[0].register_forward_pre_hook(first_pre)
model[2].register_full_backward_hook(head_backward)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
optimizer.register_step_pre_hook(before_step)
data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randint(0, 2, (24,)))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    STEP[0] += 1
print("done", STEP[0], flush=True)
