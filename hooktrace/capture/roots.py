"""Naming modules when no model is given (docs/contract.md, Scripts): each outermost module call is a root.

A module call is outermost when no other module call is open on its thread. Roots are taken in the
order of their first outermost call; a module already inside an earlier root (a checkpointed block
recomputed during backward, `model.encoder(x)` called on its own) is not a root of its own. Paths
are `named_modules()` paths under their root; with several roots each is prefixed by the root's
label: its class name, `Name#2` for the second root of the same class.
"""

from __future__ import annotations

import weakref
from itertools import repeat
from operator import add, attrgetter, is_, itemgetter
from typing import Any, Callable, Iterable

import torch

from ..kinds import TENSOR, K
from . import batched, comm, dicts


def outermost(calls: Iterable[tuple]) -> list[int]:
    """Module keys of the outermost calls, in call order (first seen first, no repeats).

    `calls`: the capture's module-call records `(enter_seq, exit_seq, phase, module_key, thread, ...)`.
    """
    ordered = sorted(calls, key=lambda c: c[0])
    open_until: dict[int, int] = {}  # thread -> exit seq of its outermost open call
    found: dict[int, None] = {}
    for call in ordered:
        enter, leave, _phase, module_id, thread = call[:5]
        if enter < open_until.get(thread, -1):
            continue  # inside an outermost call on this thread
        open_until[thread] = leave
        found.setdefault(module_id, None)
    return list(found)


def choose(candidates: list[Any]) -> list[Any]:
    """The candidates that are not inside an earlier (or later) candidate's module tree."""
    inside: set[int] = set()
    for module in candidates:
        for sub in module.modules():
            if sub is not module:
                inside.add(id(sub))
    roots: list[Any] = []
    seen: set[int] = set()
    for module in candidates:
        if id(module) not in inside and id(module) not in seen:
            roots.append(module)
            seen.add(id(module))
    return roots


def labels(roots: list[Any]) -> list[str]:
    """`""` for a single root; else the class name, `Name#2` for the second root of that class."""
    if len(roots) == 1:
        return [""]
    counts: dict[str, int] = {}
    out = []
    for module in roots:
        name = type(module).__name__
        counts[name] = counts.get(name, 0) + 1
        out.append(name if counts[name] == 1 else f"{name}#{counts[name]}")
    return out


def named_modules(roots: list[Any]) -> list[tuple[str, Any]]:
    """(path, module) of every module under the roots, each module once, roots in order."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for label, root in zip(labels(roots), roots):
        for path, module in root.named_modules():
            if id(module) in seen:
                continue
            seen.add(id(module))
            out.append((f"{label}.{path}" if label and path else label or path, module))
    return out


def modules_called(rec: Any, keys: list[int]) -> list[Any]:
    """The module objects of the recorder's `keys` that are still alive (the recorder holds every
    module it gave a key by weak reference)."""
    by_key: dict[int, Any] = {}
    for entry in rec.modules:
        module = entry() if isinstance(entry, weakref.ref) else entry
        if isinstance(module, torch.nn.Module):
            by_key[rec.key(module)] = module
    return [by_key[k] for k in keys if k in by_key]


def of_calls(rec: Any) -> list[Any]:
    """The roots of a capture with no model: the live modules of its outermost calls, nested ones out."""
    return choose(modules_called(rec, outermost(rec.calls)))


OUTSIDE = "(outside)"  # the prefix of a module called inside the model but not part of it
# the prefix of a GraphModule that torch.compile made and called as a module inside a compiled call
# (AOTAutograd's compiled forward: global hooks fire for it, pytorch/pytorch#149502)
COMPILED = "(torch.compile)"


def called_keys(rec: Any) -> list[int]:
    """Keys of every module a module call or a hook call of the capture names, first seen first."""
    keys = dict.fromkeys(map(itemgetter(3), list(rec.calls)))
    keys.update(dict.fromkeys(map(itemgetter(6), list(rec.hooks))))
    keys.pop(None, None)  # hook calls of no module
    return list(keys)


def outside_paths(rec: Any, paths: dict[int, str]) -> dict[int, str]:
    """Paths for the modules the capture saw called that `paths` does not name: modules called inside
    the model but not part of it (a function wrapped in a module of its own, as the `kernels` package
    does). Each is named by its class, `(outside) Func`, and what it holds under that
    (`(outside) Func.proj`); a module gone by now by its class alone (the recorder kept its name)."""
    unknown = [k for k in called_keys(rec) if k not in paths]
    if not unknown:
        return {}
    out: dict[int, str] = {}
    made = compile_made(rec, unknown)
    for root in choose(modules_called(rec, unknown)):
        label = f"{COMPILED if rec.key(root) in made else OUTSIDE} {type(root).__name__}"
        for path, module in module_list(root):
            key = rec.key(module)
            if key not in paths and key not in out:
                out[key] = f"{label}.{path}" if path else label
    for key in unknown:
        if key not in out and key in rec.types:
            out[key] = f"{OUTSIDE} {rec.types[key]}"
    return out


def compile_made(rec: Any, keys: list[int]) -> set[int]:
    """The `keys` of FX GraphModules called only inside calls that ran compiled (`rec.compiled`) on
    their thread: graphs torch.compile made and runs as modules (AOTAutograd's compiled forward), not
    modules of the user's."""
    windows = {c[0]: c for c in list(rec.calls) if c[0] in set(rec.compiled)}
    if not windows:
        return set()
    graph_modules = {rec.key(m) for m in modules_called(rec, keys) if isinstance(m, torch.fx.GraphModule)}
    inside: dict[int, bool] = {}
    for enter, leave, _phase, key, tid, *_ in list(rec.calls):
        if key in graph_modules:
            ran = any(w[0] < enter and leave < w[1] and w[4] == tid for w in windows.values())
            inside[key] = inside.get(key, True) and ran
    return {key for key, ran in inside.items() if ran}


def compiled_inner(model: Any) -> Any:
    """`m` when `model` is `torch.compile(m)`'s wrapper (an OptimizedModule), else None."""
    children = getattr(model, "__dict__", {}).get("_modules")
    return children.get("_orig_mod") if children and "_orig_mod" in children else None


def model_modules(model: Any) -> list[tuple[str, Any]]:
    """`model.named_modules()`; for `torch.compile(m)`'s wrapper, m's, with the wrapper named "" too:
    the wrapper is named as m everywhere (its calls are m's), so its hooks' events and its hooks agree."""
    inner = compiled_inner(model)
    if inner is None:
        return module_list(model)
    return [("", model), *module_list(inner)]


_children_of = attrgetter("_modules")


def module_list(model: Any) -> list[tuple[str, Any]]:
    """`list(model.named_modules())`, the same pairs in the same order, walked without a generator per
    module (a session walks the model at its start and its end: 0.7 ms for 1000 modules by
    named_modules, 0.2 ms so). A class of its own `named_modules` gets the model walked by it. A
    module whose children are all leaves, none met before, has them appended at once, by C-level
    passes (a Sequential of 1000 layers: no Python code per layer)."""
    base = torch.nn.Module.named_modules
    found: list[tuple[str, Any]] = []
    memo: set[Any] = set()
    stack = [("", model)]
    while stack:
        prefix, module = stack.pop()
        if module in memo:
            continue
        if getattr(type(module), "named_modules", None) is not base:
            return list(model.named_modules())
        memo.add(module)
        found.append((prefix, module))
        children = module._modules
        if children:
            dot = prefix + "." if prefix else ""
            names, kids = zip(*children.items())
            if (  # leaves (a Sequential of layers): taken in their order at once, as the walk would
                not any(map(is_, kids, repeat(None)))
                and all(
                    map(
                        is_,
                        map(getattr, map(type, kids), repeat("named_modules"), repeat(None)),
                        repeat(base),
                    )
                )
                and not any(map(_children_of, kids))
                and memo.isdisjoint(kids)
                and len(set(kids)) == len(kids)
            ):
                memo.update(kids)
                found += zip(map(add, repeat(dot), names), kids)
                continue
            stack.extend(
                (dot + name, child) for name, child in reversed(children.items()) if child is not None
            )
    return found


def record_held(
    book: Any,
    rec: Any,
    paths: dict[int, str],
    model: Any,
    comm_hook: Callable[[Any, Any, Any], None],
    kept: Any = None,
) -> None:
    """Record every hook the model and the global dicts hold now, and make their shims (the
    session's `comm_hook(ddp, hook, frame)` for a DDP's communication hooks; `kept`: what the
    process kept from earlier sessions, capture/kept.py)."""
    modules: list[Any] = []
    if isinstance(model, torch.nn.Module):
        named = model_modules(model)
        modules = [m for _, m in named]
        # known now, so the module's first call does not add it
        paths.update(zip(batched.module_keys(rec, modules), map(itemgetter(0), named)))
        book.met_model(named)
    for ddp in comm.ddp_modules_in(modules):
        for hook, _state in list(getattr(ddp, "_comm_hooks", ())):
            comm_hook(ddp, hook, None)
        builtin = comm.builtin_hook(ddp)
        if builtin is not None:
            book.untraceable(None, K.comm, ddp, f"{builtin} (built-in)")
    if book.fsdp is not None:  # FSDP's communication hooks (capture/fsdp.py)
        book.fsdp.held(modules)

    def tensor_hooks(d: dict, kind: str, tensor: Any) -> None:
        for hid in list(d):
            book.wrap_tensor_hook(d, hid, kind, tensor)
        book.infer_prepends(d)

    # the dicts that hold hooks: records and shims made now, not in the first step
    if kept is not None:
        kept.prewarm_dicts(book, dicts.hook_dicts_in(modules), tensor_hooks)
        return
    for hd in dicts.hook_dicts_in(modules):
        if hd.scope == TENSOR:
            tensor_hooks(hd.d, hd.kind, hd.tensor)
        else:
            book.prewarm(hd.d, hd.owner, hd.kind)
