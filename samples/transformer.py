"""A 12-layer `nn.TransformerEncoder` with a forward pre-hook and a forward hook on every module.

Run:  hooktrace run samples/transformer.py            (the whole picture, about two screens)
      hooktrace run samples/transformer.py --expand   (every layer spelled out)
      hooktrace run samples/transformer.py --module encoder.layers.3 --phase forward

What to look for:
- The 12 encoder layers run the same hooks in the same order, so the tree shows the first layer
  and collapses the rest into "x11 more with the same order"; `--expand` shows them all.
- Inside each layer: `self_attn` (MultiheadAttention; its `out_proj` is not called as a module,
  MultiheadAttention uses its weights directly, so its hooks never fire: surprise `never-fired`),
  then `dropout1`, `norm1`, `linear1`, `dropout`, `linear2`, `dropout2`, `norm2`.
- Backward: the model has no backward hooks, so the tree has no backward phase; add
  `register_full_backward_hook` calls to see them in reverse order.
"""

from __future__ import annotations

import torch
from torch import nn

CALLS: list[str] = []


class Encoder(nn.Module):
    def __init__(self, width: int = 32, heads: int = 4, depth: int = 12) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)))


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Encoder()
    for name, module in model.named_modules():

        def pre(module: nn.Module, args: tuple, name: str = name) -> None:
            CALLS.append(f"pre:{name}")

        def post(module: nn.Module, args: tuple, output: object, name: str = name) -> None:
            CALLS.append(f"post:{name}")

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
    return model, torch.randn(2, 10, 16)
