"""A 70-billion-parameter Llama on meta: its hook order in seconds, on any laptop.

Llama-3-70B's shape from transformers' `LlamaConfig` (no download), built under
`torch.device("meta")`: parameters with shapes and no data, so nothing is allocated. A shape check
before every decoder layer and a hook after each layer's backward, the kind of hooks an
activation-offloading or a gradient-logging tool registers. Run it as a dry run:

    hooktrace run samples/llama_meta.py --device meta
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CALLS = []


def check_hidden(module, args, kwargs):
    CALLS.append("check_hidden")
    assert args[0].shape[-1] == module.hidden_size  # shapes are there on meta; values are not


def grads_ready(module, grad_input, grad_output):
    CALLS.append("grads_ready")


def make():
    config = LlamaConfig(
        num_hidden_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)  # 70.6 B parameters, 0 bytes
    for layer in model.model.layers:
        layer.register_forward_pre_hook(check_hidden, with_kwargs=True)
        layer.register_full_backward_hook(grads_ready)
    token_ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    return model, {"input_ids": token_ids}
