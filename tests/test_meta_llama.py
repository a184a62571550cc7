"""A 70B-class Llama and a small Mixture-of-Experts from transformers, built on meta (no download)
and run through `hooktrace run --device meta` (issue 27): the hook order equals the hooks' own
record, the 80 layers collapse, data-needing hooks and meta-only failures are named."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import hooktrace
from hooktrace.cli import app
from hooktrace.render.badges import DRY_RUN_NOTE

pytest.importorskip("transformers")

LLAMA_70B = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

LOG = []
KINDS = ("forward_pre", "forward", "backward_pre", "backward")


def logger(path, kind):
    def hook(*args):
        LOG.append(f"{path}.{kind}")

    hook.__qualname__ = f"log_{kind}"  # one name for every layer: identical layers stay identical
    return hook


def build():
    config = LlamaConfig(
        num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
        num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def make():
    model = build()
    for i, layer in enumerate(model.model.layers):
        path = f"model.layers.{i}"
        layer.register_forward_pre_hook(logger(path, "forward_pre"))
        layer.register_forward_hook(logger(path, "forward"))
        layer.register_full_backward_pre_hook(logger(path, "backward_pre"))
        layer.register_full_backward_hook(logger(path, "backward"))
    model.lm_head.weight.register_post_accumulate_grad_hook(logger("lm_head.weight", "post_accumulate_grad"))
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    return model, {"input_ids": ids}


def needs_data():
    model = build()
    model.model.layers[2].register_forward_hook(lambda m, a, out: print(out[0].abs().max().item()))
    return model, {"input_ids": torch.zeros(1, 16, dtype=torch.long, device="meta")}


def bare():
    return build()
"""


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _factory_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Any:
    """`source` as the factory file `name`.py, trees at 80 columns; the module forgotten afterwards."""
    monkeypatch.setenv("COLUMNS", "80")
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    yield path
    sys.modules.pop(name, None)


@pytest.fixture
def llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from _factory_file(tmp_path, monkeypatch, "llama70b", LLAMA_70B)


def test_llama_70b_on_meta_hook_order_equals_the_hooks_record_and_80_layers_collapse(llama: Path) -> None:
    out_json = llama.parent / "llama.json"
    code, _, err = invoke("run", f"{llama}:make", "--device", "meta", "-o", str(out_json))
    assert code == 0, err
    assert "dry run on meta: shapes only, no values" in err
    log = sys.modules["llama70b"].LOG
    trace = hooktrace.load(out_json)
    assert trace.meta.device == "meta"
    assert sum(1 for m in trace.modules if m.type == "LlamaDecoderLayer") == 80
    traced = [
        f"{e.module}.weight.{e.kind}" if e.kind == "post_accumulate_grad" else f"{e.module}.{e.kind}"
        for e in trace.events
        if e.type == "hook"
    ]
    assert traced == log and len(log) == 4 * 80 + 1
    code, tree, err = invoke("render", str(out_json))
    assert code == 0, err
    lines = tree.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) < 40, tree  # 80 layers, forward and backward: a screen, not 320 hook lines
    assert "×79 more with the same order (model.layers.1 … model.layers.79," in tree
    assert "×79 more with the same order (model.layers.78 … model.layers.0," in tree
    assert tree.count(DRY_RUN_NOTE) == 1


def test_llama_70b_hook_that_needs_values_exits_1_with_the_order_up_to_it(llama: Path) -> None:
    code, tree, err = invoke("run", f"{llama}:needs_data", "--device", "meta")
    assert code == 1, err
    assert "forward hook needs_data.<locals>.<lambda> raised RuntimeError: Tensor.item() cannot be " in err
    assert "of module 'model.layers.2'" in err
    assert "this hook needs real data, which a dry run on meta does not have" in err
    assert "the hook order up to it is shown" in err
    assert "model.layers.2 LlamaDecoderLayer" in tree and "[error]" in tree


def test_llama_70b_all_on_meta_without_device_meta_exits_2_with_the_hint(llama: Path) -> None:
    code, _, err = invoke("run", f"{llama}:bare", "--input", "1x16", "--dtype", "int64")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "add --device meta for a dry run" in err
    # the same with --device meta: generated int64 token ids on meta
    code, _, err = invoke("run", f"{llama}:bare", "--input", "1x16", "--dtype", "int64", "--device", "meta")
    assert code == 0, err


MOE = """
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def build(dtype):
    config = Qwen3MoeConfig(
        num_hidden_layers=24, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        vocab_size=1000,
    )
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config).to(dtype)
    for layer in model.model.layers:
        layer.mlp.register_forward_hook(lambda m, a, out: None)
        layer.mlp.gate.register_forward_hook(lambda m, a, out: None)
        layer.mlp.experts.register_full_backward_pre_hook(lambda m, g: None)
    return model, {"input_ids": torch.zeros(1, 16, dtype=torch.long, device="meta")}


def bf16():
    return build(torch.bfloat16)


def fp32():
    return build(torch.float32)
"""


@pytest.fixture
def moe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from _factory_file(tmp_path, monkeypatch, "qwen_moe", MOE)


def test_moe_on_meta_collapses_and_a_meta_kernel_that_refuses_is_named(moe: Path) -> None:
    # bf16: the experts' grouped matmul has a meta kernel for it; routing (top-k) runs on shapes
    code, tree, err = invoke("run", f"{moe}:bf16", "--device", "meta")
    assert code == 0, err
    assert "×23 more with the same order (model.layers.1 … model.layers.23," in tree
    assert len(tree.splitlines()) < 40, tree
    # float32: that meta kernel takes only bf16 (as CUDA's does): the op is named, the order up to it shown
    code, tree, err = invoke("run", f"{moe}:fp32", "--device", "meta")
    assert code == 1
    assert "on meta, grouped_mm was refused by its meta kernel" in err
    assert "transformers/integrations/moe.py:" in err
    assert "the hook order up to it is shown" in err
    assert "model.layers.0.mlp.gate" in tree


def test_each_attention_mask_line_on_meta_gets_its_own_hint(tmp_path: Path) -> None:
    """Issue 35, item 6: the hint matches the line that read values. A training run (gradient
    checkpointing, so use_cache=False) without a mask stops in the packed-sequence check, where "give
    no attention_mask" cannot help; with a mask, SDPA's skip check; eager attention plus an explicit
    all-ones mask (what both hints say) runs."""
    path = tmp_path / "masked_llama.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from transformers import LlamaConfig, LlamaForCausalLM

            def make(attn="sdpa", mask=True):
                config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                     use_cache=False)
                config._attn_implementation = attn
                with torch.device("meta"):
                    model = LlamaForCausalLM(config)
                if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x; the old name warns
                    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
                else:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                model.train()
                model.model.layers[0].register_forward_hook(lambda m, a, out: None)
                ids = torch.zeros(1, 16, dtype=torch.long)
                inputs = {"input_ids": ids, "labels": ids}
                if mask:
                    inputs["attention_mask"] = torch.ones_like(ids)
                return model, inputs

            def no_mask():
                return make(mask=False)

            def eager_no_mask():
                return make("eager", mask=False)

            def eager():
                return make("eager")
            """
        ),
        encoding="utf-8",
    )
    packed = "transformers/masking_utils.py:"
    try:
        for factory in ("no_mask", "eager_no_mask"):
            code, _, err = invoke("run", f"{path}:{factory}", "--device", "meta")
            assert code == 1 and "on meta, Tensor.item() needs real data (at " + packed in err, err
            assert " in find_packed_sequence_indices " in err, err
            assert (
                "on meta pass an explicit all-ones attention_mask and build the model with "
                "attn_implementation='eager'" in err
            ), err
            assert "give no attention_mask" not in err
        code, _, err = invoke("run", f"{path}:make", "--device", "meta")
        assert code == 1 and " in _ignore_causal_mask_sdpa " in err, err
        assert (
            "on meta build the model with attn_implementation='eager' (keep the all-ones attention_mask)"
            in err
        )
        code, out, err = invoke("run", f"{path}:eager", "--device", "meta")  # what the hints say works
        assert code == 0, err
        assert "recompute" in out  # checkpointing ran its recompute on meta
    finally:
        sys.modules.pop("masked_llama", None)
