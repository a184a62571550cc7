"""What a factory returns -> a model ready to run: inputs, dtype, device, loss and optimizer (docs/contract.md, The factory).

torch is imported inside the functions that need it, so `import hooktrace` stays light.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .options import RunOptions, UsageError, dtype_name, parse_shape
from .schema import META_DEVICE

RETURN_FORMS = (
    "an nn.Module, (module, inputs) or hooktrace.Target(model, inputs=..., loss=..., optimizer=...)"
)
INPUT_HINT = "return (model, inputs) from the factory, or pass --input SHAPE (e.g. --input 8x3x32x32)"


@dataclass
class Inputs:
    """Positional and keyword inputs for one forward call: `model(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Target:
    """What a factory may return: the model, optional inputs, optional `loss(output) -> scalar`, and an
    optional optimizer (then each step ends with `optimizer.step()` and `optimizer.zero_grad()`)."""

    model: Any
    inputs: Any = None
    loss: Optional[Callable[[Any], Any]] = None
    optimizer: Any = None


# -- factory result -> Target --------------------------------------------------------------------


def coerce_result(result: Any, label: str = "the factory") -> Target:
    """Any return form of docs/contract.md -> Target(model, Inputs | None, loss, optimizer)."""
    from torch import nn

    if isinstance(result, Target):
        target = Target(result.model, result.inputs, result.loss, result.optimizer)
    elif isinstance(result, nn.Module):
        target = Target(result)
    elif isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module):
        target = Target(result[0], result[1])
    else:
        raise UsageError(f"{label} returned {_describe(result)}; return {RETURN_FORMS}")
    if not isinstance(target.model, nn.Module):
        got = _describe(target.model)
        raise UsageError(f"{label} returned a Target whose model is {got}; give an nn.Module")
    if target.loss is not None and not callable(target.loss):
        raise UsageError(f"{label} returned a Target whose loss is not callable; give loss=lambda out: ...")
    if target.optimizer is not None and not callable(getattr(target.optimizer, "step", None)):
        got = _describe(target.optimizer)
        raise UsageError(f"{label} returned a Target whose optimizer is {got}; give a torch.optim optimizer")
    target.inputs = coerce_inputs(target.inputs)
    return target


def coerce_inputs(inputs: Any) -> Optional[Inputs]:
    """tensor -> one positional; tuple/list -> positional; dict -> keywords; Inputs as is."""
    if inputs is None:
        return None
    if isinstance(inputs, Inputs):
        return Inputs(tuple(inputs.args), dict(inputs.kwargs))
    if isinstance(inputs, tuple) and hasattr(inputs, "_fields"):  # a namedtuple is one input
        return Inputs((inputs,))
    if isinstance(inputs, (tuple, list)):
        return Inputs(tuple(inputs))
    if isinstance(inputs, dict):
        if not all(isinstance(k, str) for k in inputs):
            raise UsageError("keyword inputs must have str keys; use Inputs(args, kwargs) for anything else")
        return Inputs((), dict(inputs))
    return Inputs((inputs,))  # a tensor, or any other single object


def _describe(obj: Any) -> str:
    if obj is None:
        return "None"
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(type(x).__name__ for x in obj[:4])
        return f"a {type(obj).__name__} of {len(obj)} ({inner})"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


# -- --input shapes, --dtype, --device --------------------------------------------------------


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, dtype_name(name))


def make_inputs(shapes: Sequence[str], dtype: Any = None, seed: int = 0, device: Any = None) -> Inputs:
    """Seeded random tensors, one positional input per `--input` shape (CPU; moved later). On the
    meta device (a dry run) they are made there: shapes without values, however large."""
    import torch

    dtype = dtype if dtype is not None else torch.float32
    gen = torch.Generator().manual_seed(seed)
    args = []
    for text in shapes:
        shape = parse_shape(text)
        try:
            if device is not None and torch.device(device).type == META_DEVICE:
                args.append(torch.empty(shape, dtype=dtype, device=META_DEVICE))
            elif dtype.is_floating_point:
                args.append(torch.randn(shape, generator=gen).to(dtype))
            else:  # small non-negative ints: valid indices for any embedding
                args.append(torch.randint(0, 2, shape, generator=gen).to(dtype))
        except (RuntimeError, MemoryError, OverflowError, ValueError) as exc:
            size = 1
            for s in shape:
                size *= s
            raise UsageError(
                f"--input {text}: cannot make a tensor of {size:,} elements "
                f"({type(exc).__name__}: {_first_line(exc)}); give a smaller shape"
            ) from exc
    return Inputs(tuple(args))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def resolve_device(device: Optional[str]) -> Optional[Any]:
    """`--device` -> torch.device, or None when not given. CUDA asked for but absent -> UsageError."""
    if device is None:
        return None
    import torch

    name = device.strip().lower()
    if name == META_DEVICE:  # a dry run: shapes only
        return torch.device(META_DEVICE)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown --device {device!r}; use cpu, cuda, cuda:N, auto or meta") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build of torch" if torch.version.cuda is None else "no CUDA device visible"
            raise UsageError(f"--device {device}: CUDA is not available ({build}); use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            devices = f"{count} CUDA device{'s' if count != 1 else ''}"
            raise UsageError(f"--device {device}: only {devices} here; pick another index")
    elif dev.type != "cpu":
        raise UsageError(f"unsupported --device {device!r}; use cpu, cuda, cuda:N, auto or meta")
    return dev


def model_device(model: Any) -> tuple[Any, Optional[str]]:
    """Where the inputs go when `--device` is not given, and a note when that is not simply the
    device of the first parameter (offloaded models keep parameters on `meta`)."""
    import torch

    tensors = [("parameter", n, t) for n, t in model.named_parameters()]
    tensors += [("buffer", n, t) for n, t in model.named_buffers()]
    if not tensors:
        return torch.device("cpu"), None
    if not tensors[0][2].is_meta:
        return tensors[0][2].device, None
    for path, module in model.named_modules():
        declared = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if declared is not None:
            device = torch.device(declared if not isinstance(declared, int) else f"cuda:{declared}")
            owner = f"module '{path}'" if path else "the root module"
            return device, f"inputs on {device}: the execution device the offload hook of {owner} declares"
    for what, name, t in tensors:
        if not t.is_meta:
            first = tensors[0][1]
            return t.device, (
                f"inputs on {t.device}, the device of {what} '{name}' (the first not on meta; "
                f"'{first}' is on meta, offloaded)"
            )
    raise UsageError(
        "the factory returned a model whose parameters are all on the meta device (shapes, no data); "
        "add --device meta for a dry run (the hook order on shapes, no values), or materialise it "
        "(e.g. model.to_empty(device='cpu') and load the weights)"
    )


def model_dtype(model: Any) -> Any:
    """The dtype of the model's first floating-point parameter; float32 otherwise."""
    import torch

    for t in model.parameters():
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def to_device(obj: Any, device: Any) -> Any:
    """Move every tensor in nested tuples/lists/dicts to `device` (others unchanged)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(x, device) for x in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    return obj


def _check_arity(model: Any, count: int) -> None:
    """More `--input` than `forward` takes positionally, or fewer than it needs -> UsageError
    (before anything runs)."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or odd callable: let the forward call decide
        return
    params = list(signature.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if count > len(positional) or count < len(required):
        names = ", ".join(p.name for p in positional) or "none"
        takes = (
            f"{len(required)} to {len(positional)}" if len(required) != len(positional) else len(positional)
        )
        raise UsageError(
            f"{count} --input given but {type(model).__name__}.forward takes {takes} positional "
            f"input(s) ({names}); give one --input per positional argument"
        )


@dataclass
class Prepared:
    """A model ready to run: `model(*inputs.args, **inputs.kwargs)`, with its loss, optimizer, device."""

    model: Any
    inputs: Inputs
    loss: Optional[Callable[[Any], Any]]
    device: Any
    optimizer: Any = None
    generated: bool = False  # inputs made from --input shapes
    notes: list[str] = field(default_factory=list)


def prepare(target: Target, options: RunOptions = RunOptions()) -> Prepared:
    """Apply `--input`, `--dtype`, `--device` and `--optimizer` to a coerced Target. Raises UsageError."""
    notes: list[str] = []
    dev = resolve_device(options.device)
    model = target.model
    replaced: list[Any] = []
    if dev is not None:
        before = dict(model.named_parameters())
        try:
            moved = model.to(dev)  # nn.Module.to returns self; tolerate overrides returning None
            model = model if moved is None else moved  # no truth test: it would call a module's __len__
        except NotImplementedError as exc:  # "Cannot copy out of meta tensor"
            raise UsageError(
                f"--device {options.device}: cannot move the model ({_first_line(exc)}); "
                "give a model whose parameters hold data, or use --device meta for a dry run on shapes"
            ) from exc
        replaced = [before[n] for n, p in model.named_parameters() if n in before and before[n] is not p]
        run_device = dev
    else:
        run_device, note = model_device(model)
        if note:
            notes.append(note)
    if options.input_shapes:  # explicit shapes win over inputs the factory gave
        _check_arity(model, len(options.input_shapes))
        tdtype = torch_dtype(options.dtype) if options.dtype else model_dtype(model)
        inputs = make_inputs(options.input_shapes, tdtype, device=run_device)
    elif target.inputs is not None:
        inputs = target.inputs
        if options.dtype:
            notes.append(f"--dtype {options.dtype} not applied: it sets the dtype of --input tensors")
    else:
        raise UsageError(f"no inputs: {INPUT_HINT}")
    inputs = Inputs(to_device(tuple(inputs.args), run_device), to_device(dict(inputs.kwargs), run_device))
    optimizer = target.optimizer
    if options.optimizer is not None:
        if optimizer is not None:
            notes.append(f"--optimizer {options.optimizer} used instead of the factory's optimizer")
        optimizer = make_optimizer(options.optimizer, model)
    notes += _replaced_notes(replaced, optimizer if options.optimizer is None else None, options.device)
    return Prepared(model, inputs, target.loss, run_device, optimizer, bool(options.input_shapes), notes)


def _replaced_notes(replaced: list[Any], optimizer: Any, device: Optional[str]) -> list[str]:
    """Moving a model to another kind of tensor (cpu -> meta) makes new parameter objects: what
    the factory attached to the old ones (tensor hooks, its optimizer) stays with them."""
    if not replaced:
        return []
    notes = []
    old = {id(p) for p in replaced}
    hooked = sum(
        len(getattr(p, "_backward_hooks", None) or {})
        + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        for p in replaced
    )
    if hooked:
        notes.append(
            f"--device {device} made new parameter tensors: {hooked} hook(s) the factory registered on "
            "parameters stay on the old ones and cannot fire; build the model on that device "
            "(e.g. under `with torch.device(...)`) or register them after moving it"
        )
    groups = getattr(optimizer, "param_groups", None) or []
    if any(id(p) in old for g in groups for p in g.get("params", ())):
        notes.append(
            f"--device {device} made new parameter tensors: the factory's optimizer holds the old ones, "
            "so its step updates nothing the model uses (the step's hooks still fire); build the model "
            "on that device, or use --optimizer"
        )
    return notes


def make_optimizer(name: str, model: Any) -> Any:
    """`--optimizer sgd|adam|adamw` over the parameters that require grad, with PyTorch's defaults."""
    import torch

    classes = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UsageError(f"--optimizer {name}: no parameter of the model requires grad; drop --optimizer")
    return classes[name.lower()](params)


# -- loss ----------------------------------------------------------------------------------------


def floating_tensors(obj: Any, _seen: Optional[set[int]] = None) -> list[Any]:
    """Every floating-point tensor in nested tuples/lists/dicts/dataclasses, in order."""
    import torch

    seen = _seen if _seen is not None else set()
    if id(obj) in seen:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    found: list[Any] = []
    if isinstance(obj, (tuple, list, dict)) or dataclasses.is_dataclass(obj):
        seen.add(id(obj))
    if isinstance(obj, dict):
        for v in obj.values():
            found += floating_tensors(v, seen)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            found += floating_tensors(v, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            found += floating_tensors(getattr(obj, f.name, None), seen)
    return found


def default_loss(output: Any) -> Optional[Any]:
    """Sum of every floating-point tensor in the output that requires grad; None when none does."""
    tensors = [t for t in floating_tensors(output) if t.requires_grad]
    if not tensors:
        return None
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum().to(total.device)
    return total


def compute_loss(output: Any, loss: Optional[Callable[[Any], Any]] = None) -> Optional[Any]:
    """The scalar to call `.backward()` on, or None when nothing requires grad."""
    import torch

    if loss is None:
        return default_loss(output)
    value = loss(output)
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return None
    return value if value.numel() == 1 else value.sum()
