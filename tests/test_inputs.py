"""What factories return -> a runnable model: inputs, dtype, device, loss, optimizer (hooktrace/inputs.py)."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from hooktrace.inputs import (
    Inputs,
    Target,
    coerce_inputs,
    coerce_result,
    compute_loss,
    default_loss,
    make_inputs,
    prepare,
    resolve_device,
    torch_dtype,
)
from hooktrace.options import RunOptions, UsageError, parse_shape

# -- factory results ------------------------------------------------------------------------------


def test_every_return_form() -> None:
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    loss = lambda out: out.mean()  # noqa: E731

    assert coerce_result(model).inputs is None
    assert coerce_result((model, x)).inputs.args == (x,)
    assert coerce_result([model, (x, x)]).inputs.args == (x, x)
    assert coerce_result((model, [x])).inputs.args == (x,)
    assert coerce_result((model, {"input": x})).inputs == Inputs((), {"input": x})
    assert coerce_result((model, Inputs((x,), {"k": 1}))).inputs == Inputs((x,), {"k": 1})
    target = coerce_result(Target(model, inputs=x, loss=loss))
    assert target.model is model and target.inputs.args == (x,) and target.loss is loss
    assert coerce_result(Target(model)).inputs is None


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (None, "returned None"),
        (3, "builtins.int"),
        ((1, 2), "a tuple of 2"),
        ((nn.Linear(1, 1), 1, 2), "a tuple of 3"),
        (Target(model="nope"), "whose model is"),
        (Target(nn.Linear(1, 1), loss=3), "loss is not callable"),
    ],
)
def test_wrong_returns_are_usage_errors(result: object, words: str) -> None:
    with pytest.raises(UsageError, match="return|give") as info:
        coerce_result(result, "make()")
    assert words in str(info.value)


def test_inputs_forms() -> None:
    x = torch.zeros(1)
    Pair = namedtuple("Pair", "a b")
    pair = Pair(x, x)
    assert coerce_inputs(None) is None
    assert coerce_inputs(x) == Inputs((x,))
    assert coerce_inputs(pair).args == (pair,)  # a namedtuple is one structured input
    assert coerce_inputs("text") == Inputs(("text",))
    with pytest.raises(UsageError, match="str keys"):
        coerce_inputs({1: x})


# -- --input, --dtype, --device -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shape"), [("8x3x32x32", (8, 3, 32, 32)), ("4", (4,)), ("2X5", (2, 5)), ("2,5", (2, 5))]
)
def test_parse_shape(text: str, shape: tuple[int, ...]) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "x", "8x", "8xa", "0x3", "-1x2", "1.5x2"])
def test_parse_shape_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="bad --input"):
        parse_shape(text)


def test_dtypes() -> None:
    assert torch_dtype("float16") is torch.float16
    assert torch_dtype("torch.bfloat16") is torch.bfloat16
    assert torch_dtype("long") is torch.int64
    with pytest.raises(UsageError, match="unknown --dtype 'float8'"):
        torch_dtype("float8")


def test_make_inputs_is_seeded_and_typed() -> None:
    a = make_inputs(["2x3", "4"], torch.float64)
    b = make_inputs(["2x3", "4"], torch.float64)
    assert [t.shape for t in a.args] == [(2, 3), (4,)]
    assert all(t.dtype is torch.float64 for t in a.args)
    assert all(torch.equal(x, y) for x, y in zip(a.args, b.args))
    ints = make_inputs(["16"], torch.int64).args[0]
    assert ints.dtype is torch.int64 and set(ints.tolist()) <= {0, 1}


def test_devices() -> None:
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UsageError, match="unknown --device"):
        resolve_device("gpu0")
    assert resolve_device("meta") == torch.device("meta")  # a dry run (tests/test_meta.py)
    with pytest.raises(UsageError, match="unsupported --device"):
        resolve_device("xpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_asked_for_but_absent() -> None:
    with pytest.raises(UsageError, match="CUDA is not available.*--device cpu"):
        resolve_device("cuda")


def test_prepare_inputs_follow_the_first_parameter_not_on_meta() -> None:
    """accelerate-style offload: the first parameters are on meta, the rest hold data."""
    model = nn.Sequential(nn.Linear(3, 3, device="meta"), nn.Linear(3, 2))
    prepared = prepare(coerce_result((model, {"input": torch.randn(2, 3)})))
    assert prepared.device.type == "cpu"
    assert prepared.inputs.kwargs["input"].device.type == "cpu"
    assert next(model.parameters()).device.type == "meta"  # the model is left as it is
    assert len(prepared.notes) == 1 and "'1.weight'" in prepared.notes[0] and "meta" in prepared.notes[0]
    plain = prepare(coerce_result((nn.Linear(3, 2), torch.randn(2, 3))))
    assert plain.device.type == "cpu" and plain.notes == []  # nothing on meta: nothing to say


def test_prepare_inputs_go_to_the_execution_device_the_offload_hook_declares() -> None:
    class Hook:  # what accelerate's AlignDevicesHook exposes
        execution_device = "cpu"

    model = nn.Sequential(nn.Linear(3, 3, device="meta"), nn.Linear(3, 2, device="meta"))
    model[0]._hf_hook = Hook()
    prepared = prepare(coerce_result((model, torch.randn(2, 3))))
    assert prepared.device == torch.device("cpu") and prepared.inputs.args[0].device.type == "cpu"
    assert "execution device" in prepared.notes[0] and "module '0'" in prepared.notes[0]


def test_prepare_refuses_a_model_all_on_meta() -> None:
    model = nn.Linear(3, 2, device="meta")
    with pytest.raises(UsageError, match="all on the meta device"):
        prepare(coerce_result((model, torch.randn(2, 3))))
    with pytest.raises(UsageError, match="cannot move the model"):
        prepare(coerce_result((model, torch.randn(2, 3))), RunOptions(device="cpu"))


def test_an_input_too_large_to_allocate_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--input 100000000000x4: cannot make a tensor of 400,000,000,000"):
        make_inputs(["100000000000x4"])


def test_more_inputs_than_forward_takes_is_refused_before_running() -> None:
    with pytest.raises(UsageError, match="3 --input given but Linear.forward takes 1 positional"):
        prepare(coerce_result(nn.Linear(3, 2)), RunOptions(input_shapes=("2x3", "2x3", "2x3")))
    with pytest.raises(UsageError, match="1 --input given but Bilinear.forward takes 2 positional"):
        prepare(coerce_result(nn.Bilinear(3, 5, 2)), RunOptions(input_shapes=("4x3",)))
    bilinear = prepare(coerce_result(nn.Bilinear(3, 5, 2)), RunOptions(input_shapes=("4x3", "4x5")))
    assert [tuple(a.shape) for a in bilinear.inputs.args] == [(4, 3), (4, 5)]


def test_optimizer_from_the_flag_or_the_factory() -> None:
    model = nn.Linear(3, 2)
    adam = prepare(coerce_result((model, torch.randn(1, 3))), RunOptions(optimizer="adam"))
    assert type(adam.optimizer) is torch.optim.Adam
    assert adam.optimizer.param_groups[0]["params"] == list(model.parameters())
    assert adam.optimizer.defaults["lr"] == torch.optim.Adam(model.parameters()).defaults["lr"]
    own = torch.optim.SGD(model.parameters(), lr=0.5)
    given = prepare(coerce_result(Target(model, inputs=torch.randn(1, 3), optimizer=own)))
    assert given.optimizer is own and given.notes == []
    replaced = prepare(
        coerce_result(Target(model, torch.randn(1, 3), optimizer=own)), RunOptions(optimizer="sgd")
    )
    assert replaced.optimizer is not own and "instead of the factory's optimizer" in replaced.notes[0]
    with pytest.raises(UsageError, match="whose optimizer is"):
        coerce_result(Target(model, optimizer="adam"))
    with pytest.raises(UsageError, match="no parameter of the model requires grad"):
        prepare(
            coerce_result((nn.Linear(3, 2).requires_grad_(False), torch.randn(1, 3))),
            RunOptions(optimizer="sgd"),
        )


class RecordingLinear(nn.Linear):
    """Records `.to()` calls: the machine has no second device to move to."""

    moved_to: list = []

    def to(self, *args, **kwargs):  # type: ignore[override]
        self.moved_to.append(args)
        return super().to(*args, **kwargs)


def test_prepare_device_moves_model_and_inputs() -> None:
    model = RecordingLinear(3, 2)
    prepared = prepare(coerce_result((model, {"input": torch.randn(2, 3)})), RunOptions(device="cpu"))
    assert model.moved_to == [(torch.device("cpu"),)]
    assert prepared.device == torch.device("cpu")
    assert prepared.inputs.kwargs["input"].device.type == "cpu"
    RecordingLinear.moved_to = []
    prepare(coerce_result((model, torch.randn(2, 3))))
    assert model.moved_to == []  # no --device: the model stays where the factory put it


def test_prepare_shapes_win_and_take_the_model_dtype() -> None:
    model = nn.Linear(3, 2).to(torch.float64)
    prepared = prepare(coerce_result((model, torch.zeros(1, 3))), RunOptions(input_shapes=("5x3",)))
    (x,) = prepared.inputs.args
    assert x.shape == (5, 3) and x.dtype is torch.float64
    assert (
        prepare(coerce_result(model), RunOptions(input_shapes=("5x3",), dtype="float16")).inputs.args[0].dtype
        is torch.float16
    )


def test_prepare_without_inputs_says_how_to_give_them() -> None:
    with pytest.raises(UsageError, match="--input SHAPE"):
        prepare(coerce_result(nn.Linear(3, 2)))


# -- loss -----------------------------------------------------------------------------------------


@dataclass
class Out:
    logits: torch.Tensor
    labels: torch.Tensor
    extra: dict


def test_default_loss_sums_every_floating_tensor_in_nested_output() -> None:
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(2, requires_grad=True)
    c = torch.randn(4, requires_grad=True)
    d = torch.randn(5, requires_grad=True)
    output = (a * 2, [Out(b * 1, torch.arange(3), {"c": c * 3, "n": None})], {"d": (d + 1,)})
    loss = default_loss(output)
    assert loss.shape == ()
    loss.backward()
    assert torch.equal(a.grad, torch.full_like(a, 2.0))
    assert torch.equal(b.grad, torch.ones_like(b))
    assert torch.equal(c.grad, torch.full_like(c, 3.0))
    assert torch.equal(d.grad, torch.ones_like(d))


def test_default_loss_is_none_when_nothing_requires_grad() -> None:
    assert default_loss((torch.randn(2), torch.arange(3), {"x": "text"})) is None
    with torch.no_grad():
        assert default_loss(nn.Linear(2, 2)(torch.randn(1, 2))) is None


def test_custom_loss() -> None:
    x = torch.randn(3, requires_grad=True)
    assert compute_loss(x * 2, lambda out: out[0]).grad_fn is not None
    summed = compute_loss(x * 2, lambda out: out)  # not a scalar: summed
    assert summed.shape == ()
    assert compute_loss(x * 2, lambda out: 3.0) is None
