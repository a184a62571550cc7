"""An ordinary Hugging Face `Trainer` script (no factory): trace it with

    hooktrace exec --start 2 --steps 1 samples/trainer_script.py

A 2-layer Llama with random weights, an in-memory dataset, gradient checkpointing on. Look for: the
layers' forward running again in backward (`recompute`), with checkpoint's saved-tensor hooks;
transformers' own `enable_input_require_grads` hook on the embeddings; this script's hooks with the
lines that registered them.
"""

import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


def log_attention_input(module, args, kwargs):
    pass


def clip_norm_grad(module, grad_input, grad_output):
    pass


torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
model = LlamaForCausalLM(config)
model.model.layers[0].self_attn.register_forward_pre_hook(log_attention_input, with_kwargs=True)
model.model.norm.register_full_backward_hook(clip_norm_grad)

# transformers 5 renamed gradient_checkpointing (the old name warns); older releases know only it
CHECKPOINTING = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in TrainingArguments.__dataclass_fields__
)

g = torch.Generator().manual_seed(1)
data = [
    {"input_ids": (ids := torch.randint(0, 64, (16,), generator=g)), "labels": ids.clone()} for _ in range(16)
]

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=4, per_device_train_batch_size=2, **{CHECKPOINTING: True},
            report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        Trainer(model=model, args=args, train_dataset=data).train()
