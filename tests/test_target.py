"""TARGET parsing, factory loading and the coercion of what factories return (hooktrace/target.py)."""

from __future__ import annotations

import sys
import textwrap
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from hooktrace.target import (
    Inputs,
    Target,
    UsageError,
    coerce_inputs,
    coerce_result,
    compute_loss,
    default_loss,
    load_factory,
    make_inputs,
    parse_shape,
    prepare,
    resolve_device,
    split_spec,
    torch_dtype,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# -- TARGET strings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("model.py", ("model.py", "make")),
        ("model.py:build", ("model.py", "build")),
        ("dir/model.py:Zoo.small", ("dir/model.py", "Zoo.small")),
        ("pkg.models:make_net", ("pkg.models", "make_net")),
        ("pkg.models", ("pkg.models", "make")),
        ("model.py:", ("model.py", "make")),
        ("C:\\work\\model.py", ("C:\\work\\model.py", "make")),
        ("C:\\work\\model.py:build", ("C:\\work\\model.py", "build")),
    ],
)
def test_split_spec(spec: str, expected: tuple[str, str]) -> None:
    assert split_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", ":make", "model.py:1abc", "model.py:a-b", "model.py:a..b"])
def test_split_spec_rejects(spec: str) -> None:
    with pytest.raises(UsageError):
        split_spec(spec)


def test_file_folder_is_first_on_sys_path_while_loading_and_calling(tmp_path: Path) -> None:
    write(tmp_path / "helper_ht_mod.py", "WIDTH = 5\n")
    write(tmp_path / "lazy_ht_mod.py", "DEPTH = 7\n")
    target = write(
        tmp_path / "factory.py",
        """
        from torch import nn
        import helper_ht_mod

        def make():
            import lazy_ht_mod  # imported when the factory runs, not when the file loads
            return nn.Linear(helper_ht_mod.WIDTH, lazy_ht_mod.DEPTH)
        """,
    )
    before = list(sys.path)
    factory = load_factory(f"{target}:make")
    assert sys.path == before
    model = factory()
    assert sys.path == before
    assert (model.in_features, model.out_features) == (5, 7)
    assert factory.spec == f"{target}:make"


def test_dotted_name_and_default_name(tmp_path: Path) -> None:
    target = write(
        tmp_path / "zoo.py",
        """
        from torch import nn

        class Zoo:
            @staticmethod
            def small():
                return nn.Linear(2, 3)

        def make():
            return nn.Linear(4, 1)
        """,
    )
    assert load_factory(f"{target}:Zoo.small")().out_features == 3
    assert load_factory(str(target))().in_features == 4


def test_file_can_define_dataclasses(tmp_path: Path) -> None:
    # dataclasses look their module up in sys.modules while the class is created
    target = write(
        tmp_path / "dc_target.py",
        """
        from dataclasses import dataclass
        from torch import nn

        @dataclass
        class Config:
            width: int = 3

        def make():
            return nn.Linear(Config().width, 1)
        """,
    )
    assert load_factory(str(target))().in_features == 3


def test_package_module_target_from_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "ht_pkg_example" / "__init__.py", "")
    write(
        tmp_path / "ht_pkg_example" / "models.py",
        """
        from torch import nn

        def build():
            return nn.Linear(6, 2)
        """,
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "ht_pkg_example", raising=False)
    monkeypatch.delitem(sys.modules, "ht_pkg_example.models", raising=False)
    factory = load_factory("ht_pkg_example.models:build")
    assert factory().in_features == 6
    assert factory.spec == "ht_pkg_example.models:build"


@pytest.mark.parametrize(
    ("files", "spec", "words"),
    [
        ({}, "missing_file.py:make", ["file not found", "missing_file.py"]),
        ({"m.py": "def build(): pass\n"}, "m.py:make", ["no attribute 'make'", "build"]),
        ({"m.py": "class A: pass\n"}, "m.py:A.nope", ["no attribute 'nope'"]),
        ({"m.py": "make = 3\n"}, "m.py:make", ["not callable"]),
        (
            {"m.py": "from torch import nn\nmake = nn.Linear(1, 1)\n"},
            "m.py:make",
            ["model instance", "def make"],
        ),
        ({"m.py": "import no_such_package_ht\n"}, "m.py", ["ModuleNotFoundError", "no_such_package_ht"]),
        ({"m.py": "def make(:\n"}, "m.py", ["syntax error", "line 1"]),
        ({"m.py": "raise RuntimeError('at import')\n"}, "m.py", ["RuntimeError: at import"]),
        ({}, "no_such_pkg_ht.models:make", ["no module named 'no_such_pkg_ht'"]),
    ],
)
def test_load_errors_say_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict, spec: str, words: list[str]
) -> None:
    for name, text in files.items():
        write(tmp_path / name, text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "m", raising=False)
    with pytest.raises(UsageError) as info:
        load_factory(spec)
    message = str(info.value)
    for word in words:
        assert word in message
    assert "\n" not in message


def test_folder_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        load_factory(f"{tmp_path / 'models'}/:make")


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
    with pytest.raises(UsageError, match="unsupported --device"):
        resolve_device("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_asked_for_but_absent() -> None:
    with pytest.raises(UsageError, match="CUDA is not available.*--device cpu"):
        resolve_device("cuda")


def test_prepare_inputs_follow_the_model_device_when_no_device_given() -> None:
    model = nn.Linear(3, 2, device="meta")
    prepared = prepare(coerce_result((model, {"input": torch.randn(2, 3)})))
    assert prepared.inputs.kwargs["input"].device.type == "meta"
    assert prepared.device.type == "meta"
    assert next(model.parameters()).device.type == "meta"


class RecordingLinear(nn.Linear):
    """Records `.to()` calls: the machine has no second device to move to."""

    moved_to: list = []

    def to(self, *args, **kwargs):  # type: ignore[override]
        self.moved_to.append(args)
        return super().to(*args, **kwargs)


def test_prepare_device_moves_model_and_inputs() -> None:
    model = RecordingLinear(3, 2)
    prepared = prepare(coerce_result((model, {"input": torch.randn(2, 3)})), device="cpu")
    assert model.moved_to == [(torch.device("cpu"),)]
    assert prepared.device == torch.device("cpu")
    assert prepared.inputs.kwargs["input"].device.type == "cpu"
    RecordingLinear.moved_to = []
    prepare(coerce_result((model, torch.randn(2, 3))))
    assert model.moved_to == []  # no --device: the model stays where the factory put it


def test_prepare_shapes_win_and_take_the_model_dtype() -> None:
    model = nn.Linear(3, 2).to(torch.float64)
    prepared = prepare(coerce_result((model, torch.zeros(1, 3))), input_shapes=["5x3"])
    (x,) = prepared.inputs.args
    assert x.shape == (5, 3) and x.dtype is torch.float64
    assert (
        prepare(coerce_result(model), input_shapes=["5x3"], dtype="float16").inputs.args[0].dtype
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
