"""Where PyTorch keeps hooks: every hook dict, one iterator over them, and what their order proves."""

from __future__ import annotations

import operator
from itertools import chain, compress
from typing import Any, Iterator, NamedTuple, Optional

import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module

from .. import kinds
from ..kinds import ALWAYS_CALL, GLOBAL, MODULE, NODE, OPTIMIZER, TABLE, TENSOR, WITH_KWARGS, K

# (attribute, kind) of every hook dict, from the kinds table ("_backward_hooks" is full or legacy by
# `_is_full_backward_hook`; global ones live on torch.nn.modules.module or torch.optim.optimizer)
_MODULE_CALL_KINDS = tuple(k for k in kinds.KINDS if k not in kinds.STATE_DICT_KINDS)
CALL_DICTS = kinds.dicts_of(MODULE, _MODULE_CALL_KINDS)
STATE_DICTS = kinds.dicts_of(MODULE, kinds.STATE_DICT_KINDS)
MODULE_DICTS = CALL_DICTS + STATE_DICTS
GLOBAL_DICTS = kinds.dicts_of(GLOBAL, [k for k in kinds.KINDS if k not in kinds.OPTIMIZER_KINDS])
GLOBAL_OPTIMIZER_DICTS = kinds.dicts_of(GLOBAL, kinds.OPTIMIZER_KINDS)
OPTIMIZER_DICTS = kinds.dicts_of(OPTIMIZER)
TENSOR_DICTS = kinds.dicts_of(TENSOR)
KIND_OF_ATTR = dict(MODULE_DICTS + GLOBAL_DICTS + GLOBAL_OPTIMIZER_DICTS + OPTIMIZER_DICTS)
# Scopes whose dicts hold a shim in place during the block (autograd calls them from there).
IN_PLACE_SCOPES = frozenset({TENSOR, NODE})


class HookDict(NamedTuple):
    """One hook dict and whose it is: `owner` is the module (module scope) or None."""

    d: dict
    kind: str
    owner: Any
    scope: str  # "module", "global", "tensor" or "optimizer"
    tensor: Any = None  # the tensor, for tensor scope


def global_dict(attr: str) -> Optional[dict]:
    d = getattr(nn_module, attr, None)
    return getattr(optim_module, attr, None) if d is None else d


def scope_of(owner: Any) -> str:
    """The scope of a hook in a dict owned by `owner` (None: a global dict)."""
    if owner is None:
        return GLOBAL
    return OPTIMIZER if isinstance(owner, torch.optim.Optimizer) else MODULE


def backward_kind(owner: Any) -> str:
    """`backward` or `backward_legacy` for what a module's (or the global) `_backward_hooks` hold."""
    flag = nn_module._global_is_full_backward_hook if owner is None else owner._is_full_backward_hook
    return K.backward_legacy if flag is False else K.backward


def kind_of(attr: str, owner: Any) -> str:
    kind = KIND_OF_ATTR[attr]
    return backward_kind(owner) if kind == K.backward else kind


def global_dicts() -> Iterator[HookDict]:
    for attr, _ in GLOBAL_DICTS + GLOBAL_OPTIMIZER_DICTS:
        d = global_dict(attr)
        if d:
            yield HookDict(d, kind_of(attr, None), None, GLOBAL)


_MODULE_ATTRS = tuple(attr for attr, _ in MODULE_DICTS)
_module_dicts_of = operator.itemgetter(*_MODULE_ATTRS)
_tensor_dicts_of = operator.attrgetter(*(attr for attr, _ in TENSOR_DICTS))
_parameters_of, _values = operator.methodcaller("get", "_parameters"), operator.methodcaller("values")


def module_dicts(module: Any) -> Iterator[HookDict]:
    """The module's hook dicts that hold hooks."""
    md = module.__dict__
    for attr, _ in MODULE_DICTS:
        d = md.get(attr)
        if d:
            yield HookDict(d, kind_of(attr, module), module, MODULE)


def tensor_dicts(tensor: Any) -> Iterator[HookDict]:
    new = tuple.__new__  # HookDict's fields in order, without NamedTuple's Python-level __new__
    for attr, kind in TENSOR_DICTS:
        d = getattr(tensor, attr, None)
        if d:
            yield new(HookDict, (d, kind, None, TENSOR, tensor))


def hook_dicts(model: Any) -> Iterator[HookDict]:
    """Every hook dict that holds hooks, in the order PyTorch fires them: the global ones, then each
    module's (`named_modules()` order), then the parameters' (as `model.parameters()` gives them)."""
    return hook_dicts_in(list(model.modules()) if isinstance(model, torch.nn.Module) else [])


def hook_dicts_in(modules: list[Any]) -> Iterator[HookDict]:
    """`hook_dicts` of these modules (in this order): the global dicts, the modules', their parameters'.

    A session reads every module's at its start and its end, and most hold nothing: the modules'
    dicts are read by C-level passes (`itemgetter` over each module's `__dict__`), and so are their
    parameters'; Python looks only at the dicts that hold hooks.
    """
    yield from global_dicts()
    new = tuple.__new__
    module_dicts = [*map(vars, modules)]
    found_all = _read_all(module_dicts)
    for module, found in compress(zip(modules, found_all), map(any, found_all)):
        for attr, d in compress(zip(_MODULE_ATTRS, found), found):
            kind = KIND_OF_ATTR[attr]
            if kind == K.backward:
                kind = backward_kind(module)
            yield new(HookDict, (d, kind, module, MODULE, None))
    params: dict[int, Any] = {}
    held = [*chain.from_iterable(map(_values, filter(None, map(_parameters_of, module_dicts))))]
    try:  # a parameter None (a Linear without bias) or not a tensor: each on its own
        hooked = [*compress(held, map(any, map(_tensor_dicts_of, held)))]
    except AttributeError:
        hooked = [param for param in held if _hooked(param)]
    for param in hooked:
        params.setdefault(id(param), param)
    for param in params.values():
        yield from tensor_dicts(param)


def _read_all(module_dicts: list[Any]) -> list[tuple]:
    """Each module's hook dicts, in `_MODULE_ATTRS` order (None where its __init__ made none)."""
    try:
        return [*map(_module_dicts_of, module_dicts)]
    except KeyError:  # a module whose __init__ did not make every dict
        return [tuple(md.get(attr) for attr in _MODULE_ATTRS) for md in module_dicts]


def _hooked(param: Any) -> bool:
    try:
        return param is not None and any(_tensor_dicts_of(param))
    except AttributeError:  # not a tensor (a `_parameters` dict written by hand)
        return True


def live_hook_ids(model: Any) -> set[int]:
    """Ids of every hook registered now on the model's modules and parameters, and globally."""
    return {hid for hd in hook_dicts(model) for hid in [*hd.d]}


# kind -> ((scope, attribute, flag), ...) of the kinds that have flags
_FLAGS = {name: info.flags for name, info in TABLE.items() if info.flags}


def module_flags(owner: Any, kind: str, hook_id: int) -> tuple[bool, bool]:
    """(with_kwargs, always_call) as PyTorch's extra dicts record them (the kind's row's `flags`)."""
    with_kwargs = always_call = False
    flags = _FLAGS.get(kind)
    if flags is None:
        return with_kwargs, always_call
    scope, holder = (GLOBAL, nn_module) if owner is None else (MODULE, owner)
    for where, attr, flag in flags:
        if where == scope and hook_id in getattr(holder, attr, ()):
            if flag == WITH_KWARGS:
                with_kwargs = True
            elif flag == ALWAYS_CALL:
                always_call = True
    return with_kwargs, always_call


def inferred_prepends(keys: list[int]) -> set[int]:
    """Handle ids only grow, so a hook standing before a smaller id was prepended (docs/format.md)."""
    found: set[int] = set()
    smallest_after: Optional[int] = None
    for key in reversed(keys):
        if smallest_after is not None and key > smallest_after:
            found.add(key)
        smallest_after = key if smallest_after is None else min(smallest_after, key)
    return found
