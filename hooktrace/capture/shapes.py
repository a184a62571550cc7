"""`--shapes`: a short text of what a hook received and returned (docs/format.md's optional `shapes` column).

A hook's arguments are described one by one, joined by ", ", the module or optimizer PyTorch passes
first left out; then ` -> ` and what it returned, when it returned something (None is left out):
    forward_pre   (f32[8,16] cpu,)
    forward       (f32[8,16] cpu,), f32[8,4] cpu
    grad          f32[8,4] cpu -> f32[8,4] cpu
    forward_wrapper  f32[8,16] cpu, mask=bool[8] cpu -> f32[8,4] cpu
A tensor is `<dtype>[<shape>] <device>`: dtype as a short code (f32, bf16, i64, bool, c64, ...), the
shape as `.shape` gives it (a DTensor's is its global shape), the device as `str(.device)`; a
non-strided layout follows the shape (`f32[3,4] sparse_coo cpu`); a tensor subclass other than
Parameter is prefixed with its class name (`DTensor f32[8,16] cpu`). Only `.dtype`, `.shape`,
`.layout` and `.device` are read, with a subclass's `__torch_function__` off: no data, no sync, no
hook. What cannot be read (a strided nested tensor has no sizes) falls back to the type's name.
Tuples, lists and dicts keep their brackets; after 8 items (4 inside another container) the rest
is `…+N`; 3 levels deep, `…`. Other objects are their type's name; None is `None`. The text holds only letters, digits,
`_ . , : = [ ] ( ) { } - > + …` and spaces: a type name or a dict key with any other character
shows `?` there (names from user code never carry control characters into the trace).
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Any, Optional

import torch

from .. import kinds

MAX_ITEMS = 4  # items shown of a tuple, list or dict inside another
MAX_ARG_ITEMS = 8  # items shown of one a hook received or returned itself (args, kwargs, grad_input)
MAX_DEPTH = 3  # nesting levels shown
MAX_NAME = 40  # characters of a type name or a dict key
MAX_TEXT = 400  # characters of one hook call's text

# Kinds that PyTorch calls with their module or optimizer first: that argument is not described.
OWNER_FIRST = frozenset(
    (*kinds.MODULE_KINDS, *kinds.STATE_DICT_KINDS, *kinds.REGISTRATION_KINDS, *kinds.OPTIMIZER_KINDS)
)
_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
    torch.complex128: "c128",
    torch.complex32: "c32",
}
_SHORT = {"float": "f", "bfloat": "bf", "int": "i", "uint": "u", "complex": "c"}
_WORDS = re.compile(r"^(bfloat|float|uint|int|complex)(?=\d)")
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # described without a class name
_TENSOR, _PARAMETER = _PLAIN
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")
_UNSAFE_SIZE = re.compile(r"[^A-Za-z0-9_*+-]")  # symbolic sizes: `j1`, `s0`, `2*s0`
_UNSAFE_DEVICE = re.compile(r"[^A-Za-z0-9_:]")
_SIZES = re.compile(r"[0-9,]*")
_devices: dict[Any, str] = {}
_texts: dict[tuple, str] = {}  # (class, shape, dtype, device, layout) -> text
_interned: dict[str, str] = {}  # a hook call's text -> the one object of it
_MAX_TEXTS = 4096
_names: dict[type, str] = {}
NOT_GIVEN: Any = object()  # what a shim's positional parameter holds when PyTorch did not pass it


def _safe(text: str) -> str:
    text = _UNSAFE.sub("?", text)
    return text if len(text) <= MAX_NAME else text[: MAX_NAME - 1] + "…"


def type_name(cls: type) -> str:
    name = _names.get(cls)
    if name is None:
        name = _names[cls] = _safe(getattr(cls, "__name__", "") or "?")
    return name


def dtype_code(dtype: Any) -> str:
    """`f32`, `bf16`, `i64`, `u8`, `c64`, `f8e4m3fn`, `bool`, `qint8`: PyTorch's name, shortened."""
    code = _DTYPES.get(dtype)
    if code is None:
        name = str(dtype).removeprefix("torch.")
        code = _DTYPES[dtype] = _safe(_WORDS.sub(lambda m: _SHORT[m.group(1)], name))
    return code


def _device(device: Any) -> str:
    text = _devices.get(device)
    if text is None:
        text = _devices[device] = _UNSAFE_DEVICE.sub("?", str(device))[:MAX_NAME]
    return text


def _sizes(shape: Any) -> str:
    text = ",".join(map(str, shape))
    if _SIZES.fullmatch(text):
        return text
    return ",".join(_UNSAFE_SIZE.sub("?", str(s))[:MAX_NAME] for s in shape)


_GETTERS = tuple(vars(torch._C.TensorBase)[n] for n in ("shape", "dtype", "device", "layout", "is_nested"))


class _Metadata:
    """A tensor subclass's metadata read by TensorBase's own C getters: a subclass's `shape` or
    `dtype` property (Python code of the program's) is never called."""

    __slots__ = ("shape", "dtype", "device", "layout", "is_nested")

    def __init__(self, t: Any) -> None:
        for name, getter in zip(self.__slots__, _GETTERS):
            setattr(self, name, getter.__get__(t, type(t)))


def tensor(t: Any) -> str:
    """`f32[8,16] cpu` (see the module docstring); the type's name when its metadata cannot be read."""
    cls = type(t)
    if cls in _PLAIN:
        return _tensor(t, cls)
    try:
        with torch._C.DisableTorchFunctionSubclass():
            return _tensor(_Metadata(t), cls)
    except Exception:  # noqa: BLE001 - a subclass's metadata may raise anything: its name then
        return type_name(cls)


def _tensor(t: Any, cls: type) -> str:
    """The text of a tensor, looked up by what it is made of: a step's tensors repeat their shapes."""
    try:
        key = (cls, t.shape, t.dtype, t.device, t.layout)
        text = _texts.get(key)
    except Exception:  # noqa: BLE001 - no sizes (a strided nested tensor), unhashable symbolic sizes
        return _uncached(t, cls)
    if text is None:
        text = _uncached(t, cls)
        if len(_texts) >= _MAX_TEXTS:
            _texts.clear()
        _texts[key] = text
    return text


def _uncached(t: Any, cls: type) -> str:
    prefix = "" if cls in _PLAIN else type_name(cls) + " "
    try:
        layout = t.layout
        if layout is torch.strided:
            sizes = "nested" if t.is_nested else _sizes(t.shape)
            return f"{prefix}{dtype_code(t.dtype)}[{sizes}] {_device(t.device)}"
        where = f"{_safe(str(layout).removeprefix('torch.'))} {_device(t.device)}"
        return f"{prefix}{dtype_code(t.dtype)}[{_sizes(t.shape)}] {where}"
    except Exception:  # noqa: BLE001
        return type_name(cls)


def value(x: Any, depth: int = 1) -> str:
    """One object: a tensor, None, a container of them (kept short), else its type's name. `depth`:
    how deep it is (a hook's argument is 1); containers at MAX_DEPTH show as `(…)`."""
    cls = type(x)
    if cls is _TENSOR or cls is _PARAMETER:
        return _tensor(x, cls)
    if x is None:
        return "None"
    if cls is tuple or cls is list:  # PyTorch's own arguments: sliced in C
        if depth >= MAX_DEPTH:
            return "(…)" if cls is tuple else "[…]"
        n, most = len(x), MAX_ARG_ITEMS if depth == 1 else MAX_ITEMS
        if n > most:
            inner = ", ".join([value(v, depth + 1) for v in x[:most]]) + f", …+{n - most}"
        elif n == 1:
            return f"[{value(x[0], depth + 1)}]" if cls is list else f"({value(x[0], depth + 1)},)"
        else:
            inner = ", ".join([value(v, depth + 1) for v in x])
        return f"[{inner}]" if cls is list else f"({inner})"
    # subclasses are read through their base's own C methods, never through what the subclass defines
    # (`__class__`, `__len__`, `__iter__`, `items`): describing must not run the program's code
    if issubclass(cls, torch.Tensor):
        return tensor(x)
    if issubclass(cls, (tuple, list)):  # a namedtuple, torch.Size, a list subclass
        if depth >= MAX_DEPTH:
            return f"{type_name(cls)}(…)"
        most = MAX_ARG_ITEMS if depth == 1 else MAX_ITEMS
        base: Any = tuple if issubclass(cls, tuple) else list
        n = base.__len__(x)
        items = [value(base.__getitem__(x, i), depth + 1) for i in range(min(n, most))]
        if n > most:
            items.append(f"…+{n - most}")
        return f"{type_name(cls)}({', '.join(items)})"
    if issubclass(cls, dict):
        if depth >= MAX_DEPTH:
            return "{…}"
        most = MAX_ARG_ITEMS if depth == 1 else MAX_ITEMS
        items = [f"{_key(k)}: {value(v, depth + 1)}" for k, v in islice(dict.items(x), most)]
        n = dict.__len__(x)
        if n > most:
            items.append(f"…+{n - most}")
        return ("" if cls is dict else type_name(cls)) + "{" + ", ".join(items) + "}"
    return type_name(cls)


def _key(k: Any) -> str:
    return _safe(str.__str__(k)) if issubclass(type(k), str) else type_name(type(k))


def positional(kind: str, a: Any, b: Any, c: Any, d: Any, more: tuple) -> str:
    """`call` for a positional shim's parameters (those PyTorch did not fill hold NOT_GIVEN)."""
    if b is NOT_GIVEN:
        return call(kind, (a,))
    if c is NOT_GIVEN:
        return call(kind, (a, b))
    if d is NOT_GIVEN:
        return call(kind, (a, b, c))
    return call(kind, (a, b, c, d, *more))


def call(kind: str, args: tuple, kwargs: Optional[dict] = None) -> str:
    """What a hook of `kind` received: its arguments, the module or optimizer left out; `()` for none."""
    try:
        if kind in OWNER_FIRST:
            args = args[1:]
        text = ", ".join(map(value, args))
        if kwargs:
            named = ", ".join([f"{_safe(k)}={value(v)}" for k, v in kwargs.items()])
            text = f"{text}, {named}" if text else named
        if not text:
            return "()"
        if len(text) > MAX_TEXT:
            text = _cut(text)
        # one string object per distinct text: a step's calls repeat theirs, and records keep them
        return _interned.setdefault(text, text) if len(_interned) < _MAX_TEXTS else text
    except Exception:  # noqa: BLE001 - an object that raises when looked at: never the hook's problem
        return "?"


def returned(result: Any) -> Optional[str]:
    """What a hook returned; None when it returned None."""
    if result is None:
        return None
    try:
        text = _cut(value(result))
        return _interned.setdefault(text, text) if len(_interned) < _MAX_TEXTS else text
    except Exception:  # noqa: BLE001
        return "?"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
