"""TARGET string -> (model, inputs, loss): loading factories, coercing what they return (SPEC §2).

torch is imported inside the functions that need it, so `hooktrace --help` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

DEFAULT_NAME = "make"
RETURN_FORMS = "an nn.Module, (module, inputs) or hooktrace.Target(model, inputs=..., loss=...)"
INPUT_HINT = "return (model, inputs) from the factory, or pass --input SHAPE (e.g. --input 8x3x32x32)"
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


class UsageError(Exception):
    """Bad usage or input (exit code 2): the message says what to do."""


@dataclass
class Inputs:
    """Positional and keyword inputs for one forward call: `model(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Target:
    """What a factory may return: the model, optional inputs, optional `loss(output) -> scalar`."""

    model: Any
    inputs: Any = None
    loss: Optional[Callable[[Any], Any]] = None


# -- TARGET string -> factory -----------------------------------------------------------------


@dataclass
class Factory:
    """A loaded factory: `factory()` calls it with the target's folder first on `sys.path`."""

    spec: str  # normalised "where:NAME"
    func: Callable[[], Any]
    label: str  # "make()" or "Builder.make()", for messages
    path_entry: Optional[str] = None

    def __call__(self) -> Any:
        with _first_on_sys_path(self.path_entry):
            return self.func()


@contextlib.contextmanager
def _first_on_sys_path(entry: Optional[str]) -> Iterator[None]:
    if entry is None:
        yield
        return
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def split_spec(spec: str) -> tuple[str, str]:
    """`"samples/x.py:make"` -> ("samples/x.py", "make"); the name defaults to `make`."""
    where, sep, name = spec.rpartition(":")
    # no ":", or the ":" belongs to a Windows drive ("C:\\models\\x.py")
    if not sep or "/" in name or "\\" in name:
        where, name = spec, ""
    where, name = where.strip(), name.strip() or DEFAULT_NAME
    if not where:
        raise UsageError(f"empty target {spec!r}: give FILE.py:NAME or package.module:NAME")
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"{name!r} is not a Python name: give FILE.py:NAME or package.module:NAME")
    return where, name


def _is_file_spec(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def _module_name_for(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() else "hooktrace_target"
    existing = sys.modules.get(name)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") != path:
        name = f"hooktrace_target_{name}"  # do not shadow an unrelated, already imported module
    return name


def _import_file(path: str) -> Any:
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise UsageError(f"file not found: {path}; give the path to a .py file, e.g. samples/quickstart.py")
    if os.path.isdir(path):
        raise UsageError(f"{path} is a folder; give a .py file, e.g. {os.path.join(path, 'model.py')}:make")
    name = _module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot load {path} as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    try:
        with _first_on_sys_path(os.path.dirname(path)):
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"{path} has a syntax error at line {exc.lineno}: {exc.msg}; fix the file") from exc
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UsageError(
            f"importing {path} raised {type(exc).__name__}: {exc}; fix the import (--traceback shows where)"
        ) from exc
    return module


def _import_module(dotted: str) -> Any:
    cwd = os.getcwd()
    # `python -m` puts the working directory first; the console script does not
    with _first_on_sys_path(cwd if cwd not in sys.path else None):
        try:
            return importlib.import_module(dotted)
        except ModuleNotFoundError as exc:
            if exc.name and (dotted == exc.name or dotted.startswith(exc.name + ".")):
                raise UsageError(
                    f"no module named {exc.name!r}; give FILE.py:NAME or an importable package.module:NAME "
                    "(run from the folder that holds the package)"
                ) from exc
            raise UsageError(
                f"importing {dotted} raised ModuleNotFoundError: {exc}; install the missing package"
            ) from exc
        except Exception as exc:
            raise UsageError(
                f"importing {dotted} raised {type(exc).__name__}: {exc}; "
                "fix the import (--traceback shows where)"
            ) from exc


def _candidates(module: Any) -> str:
    names = sorted(
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and callable(v)
        and getattr(v, "__module__", None) == module.__name__
        and not isinstance(v, type)
    )
    return ", ".join(names[:8]) if names else "none"


def load_factory(spec: str) -> Factory:
    """Import the file or module named by TARGET and find NAME (dotted) in it. Raises UsageError."""
    where, name = split_spec(spec)
    path_entry = None
    if _is_file_spec(where):
        module = _import_file(where)
        path_entry = os.path.dirname(os.path.abspath(where))
        origin = where
    else:
        module = _import_module(where)
        origin = where
    obj: Any = module
    for i, part in enumerate(name.split(".")):
        if not hasattr(obj, part):
            owner = origin if i == 0 else ".".join(name.split(".")[:i])
            hint = f" (functions defined there: {_candidates(module)})" if i == 0 else ""
            raise UsageError(f"{owner} has no attribute {part!r}{hint}; give an existing NAME after ':'")
        obj = getattr(obj, part)
    if _is_module_instance(obj):
        raise UsageError(
            f"{origin}:{name} is a model instance, not a factory; wrap it in a function, "
            f"e.g. def make(): return {name.split('.')[-1]}"
        )
    if not callable(obj):
        raise UsageError(f"{origin}:{name} is a {type(obj).__name__}, not callable; give a factory function")
    return Factory(spec=f"{where}:{name}", func=obj, label=f"{name}()", path_entry=path_entry)


def _is_module_instance(obj: Any) -> bool:
    nn = sys.modules.get("torch.nn")
    return nn is not None and isinstance(obj, nn.Module)


# -- factory result -> model, inputs, loss ----------------------------------------------------


def coerce_result(result: Any, label: str = "the factory") -> Target:
    """Any return form of SPEC §2 -> Target(model, Inputs | None, loss)."""
    from torch import nn

    if isinstance(result, Target):
        target = Target(result.model, result.inputs, result.loss)
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


def parse_shape(text: str) -> tuple[int, ...]:
    """`"8x3x32x32"` -> (8, 3, 32, 32); also accepts `,` between sizes."""
    parts = [p.strip() for p in text.lower().replace(",", "x").replace("×", "x").split("x")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(s <= 0 for s in shape):
        raise UsageError(f"bad --input {text!r}: give positive sizes joined by 'x', e.g. --input 8x3x32x32")
    return shape


def torch_dtype(name: str) -> Any:
    import torch

    key = name.strip().lower().removeprefix("torch.")
    aliases = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32"}
    key = aliases.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"unknown --dtype {name!r}; use one of {', '.join(DTYPES)}")
    return getattr(torch, key)


def make_inputs(shapes: Sequence[str], dtype: Any = None, seed: int = 0) -> Inputs:
    """Seeded random tensors, one positional input per `--input` shape (CPU; moved later)."""
    import torch

    dtype = dtype if dtype is not None else torch.float32
    gen = torch.Generator().manual_seed(seed)
    args = []
    for text in shapes:
        shape = parse_shape(text)
        if dtype.is_floating_point:
            args.append(torch.randn(shape, generator=gen).to(dtype))
        else:  # small non-negative ints: valid indices for any embedding
            args.append(torch.randint(0, 2, shape, generator=gen).to(dtype))
    return Inputs(tuple(args))


def resolve_device(device: Optional[str]) -> Optional[Any]:
    """`--device` -> torch.device, or None when not given. CUDA asked for but absent -> UsageError."""
    if device is None:
        return None
    import torch

    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown --device {device!r}; use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build of torch" if torch.version.cuda is None else "no CUDA device visible"
            raise UsageError(f"--device {device}: CUDA is not available ({build}); use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise UsageError(f"--device {device}: only {count} CUDA device(s) here; pick another index")
    elif dev.type != "cpu":
        raise UsageError(f"unsupported --device {device!r}; use cpu, cuda, cuda:N or auto")
    return dev


def model_device(model: Any) -> Any:
    """The device of the model's first parameter or buffer; CPU for a model without any."""
    import torch

    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


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


@dataclass
class Prepared:
    """A model ready to run: `model(*inputs.args, **inputs.kwargs)`, with its loss and device."""

    model: Any
    inputs: Inputs
    loss: Optional[Callable[[Any], Any]]
    device: Any


def prepare(
    target: Target,
    *,
    input_shapes: Sequence[str] = (),
    dtype: Optional[str] = None,
    device: Optional[str] = None,
) -> Prepared:
    """Apply `--input`, `--dtype` and `--device` to a coerced Target. Raises UsageError."""
    dev = resolve_device(device)
    model = target.model
    if dev is not None:
        model = model.to(dev) or model  # nn.Module.to returns self; tolerate overrides returning None
    if input_shapes:  # explicit shapes win over inputs the factory gave
        tdtype = torch_dtype(dtype) if dtype else model_dtype(model)
        inputs = make_inputs(input_shapes, tdtype)
    elif target.inputs is not None:
        if dtype:
            torch_dtype(dtype)  # still reject a bad --dtype
        inputs = target.inputs
    else:
        raise UsageError(f"no inputs: {INPUT_HINT}")
    run_device = dev if dev is not None else model_device(model)
    inputs = Inputs(to_device(tuple(inputs.args), run_device), to_device(dict(inputs.kwargs), run_device))
    return Prepared(model=model, inputs=inputs, loss=target.loss, device=run_device)


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
