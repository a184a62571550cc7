"""Hugging Face `Trainer` on a 2-layer Llama with random weights, an in-memory dataset, `max_steps=4`
and gradient checkpointing on; hooks on the model record themselves (oracle_log)."""

import sys
import tempfile

import torch
from oracle_log import STEP, record
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


def layer0_pre(module, args, kwargs):
    record("layer0_pre")


def mlp_out(module, args, output):
    record("mlp_out")


def norm_backward(module, grad_input, grad_output):
    record("norm_backward")


def embed_grad(grad):
    record("embed_grad")


class CountSteps(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        STEP[0] += 1


torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
model = LlamaForCausalLM(config)
model.model.layers[0].register_forward_pre_hook(layer0_pre, with_kwargs=True)
model.model.layers[1].mlp.register_forward_hook(mlp_out)
model.model.norm.register_full_backward_hook(norm_backward)
model.model.embed_tokens.weight.register_hook(embed_grad)

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

with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, max_steps=4, per_device_train_batch_size=2, **{CHECKPOINTING: True},
        learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[CountSteps()])
    trainer.train()
print("trained", STEP[0], file=sys.stderr)
