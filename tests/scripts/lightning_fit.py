"""PyTorch Lightning `Trainer.fit` (automatic optimization: forward and backward run in the
optimizer's closure, inside `optimizer.step()`)."""

import pytorch_lightning as pl
import torch
from oracle_log import STEP, record


def body_out(module, args, output):
    record("body_out")


def head_backward_pre(module, grad_output):
    record("head_backward_pre")


class Small(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)
        self.body.register_forward_hook(body_out)
        self.head.register_full_backward_pre_hook(head_backward_pre)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        STEP[0] += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
trainer = pl.Trainer(
    max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False,
)  # fmt: skip
trainer.fit(Small(), torch.utils.data.DataLoader(data, batch_size=4))
