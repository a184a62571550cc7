"""What is registered, per module, in the order PyTorch will fire it (`hooktrace hooks`): pure
functions of a Trace made without running the model, and the ids of the hooks still registered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ..ids import copy_of
from ..kinds import GLOBAL, KINDS, MODULE, TENSOR
from ..schema import Hook, Trace


@dataclass
class ListingRow:
    """The hooks of one kind that fire for one module (or one tensor), in firing order."""

    module: str
    kind: str
    hooks: list[Hook]
    tensor: Optional[str] = None


@dataclass
class ModuleHooks:
    """One module's rows, and the other modules (e.g. layers 1..11) whose hooks are the same."""

    module: str
    rows: list[ListingRow]
    same: list[str] = field(default_factory=list)


def firing_order(trace: Trace, live: Optional[set[int]] = None) -> list[ListingRow]:
    """Per module (named_modules order), per kind: global hooks first, then the module's dict order.

    Global hooks fire for every module; they are listed with the modules that have hooks of their own
    of that kind. Tensor hooks on parameters follow their module's rows, one row per tensor and kind.
    `live`: ids still registered (hooks the factory registered and removed again are left out).
    """
    hooks_now = [h for h in trace.hooks if (h.id in live if live is not None else not h.removed_during_run)]
    globals_by_kind: dict[str, list[Hook]] = {}
    for h in hooks_now:
        if h.scope == GLOBAL:
            globals_by_kind.setdefault(h.kind, []).append(h)
    rows: list[ListingRow] = []
    paths = [m.path for m in trace.modules]
    known = set(paths)
    paths += sorted({h.module for h in hooks_now if h.module is not None and h.module not in known})
    for path in paths:
        own = [h for h in hooks_now if h.module == path and h.scope == MODULE]
        for kind in KINDS:
            mine = [h for h in own if h.kind == kind]
            if mine:
                rows.append(ListingRow(path, kind, globals_by_kind.get(kind, []) + mine))
        tensors: dict[tuple[str, str], list[Hook]] = {}
        for h in hooks_now:
            if h.scope == TENSOR and h.module == path:
                tensors.setdefault((h.tensor or "?", h.kind), []).append(h)
        for (tensor, kind), hooks in tensors.items():
            rows.append(ListingRow(path, kind, hooks, tensor=tensor))
    return rows


def _numbered(path: str) -> str:
    return re.sub(r"(?:(?<=\.)|^)\d+(?=\.|$)", "#", path)


def _same_hook(h: Hook) -> tuple:
    copied = copy_of(h.id)  # a deep copy's hook is its own, never "the same" as another module's
    return (h.name, h.kind, h.scope, h.prepend, h.prepend_source, h.with_kwargs, h.always_call,
            h.defined_at, h.registered_at, h.registered_by, h.id if copied is not None else None)  # fmt: skip


def group_modules(rows: list[ListingRow], collapse: bool = True) -> list[ModuleHooks]:
    """Rows per module; with `collapse`, modules whose path differs only in numbers (layers.0, layers.1)
    and whose hooks are the same are folded into the first one."""
    per_module: dict[str, list[ListingRow]] = {}
    for row in rows:
        per_module.setdefault(row.module, []).append(row)
    groups: list[ModuleHooks] = []
    seen: dict[tuple, ModuleHooks] = {}
    for path, mine in per_module.items():
        prefix = f"{path}." if path else ""
        key = (
            _numbered(path),
            tuple(
                (r.kind, (r.tensor or "").removeprefix(prefix), tuple(_same_hook(h) for h in r.hooks))
                for r in mine
            ),
        )
        if collapse and key in seen:
            seen[key].same.append(path)
            continue
        group = ModuleHooks(path, mine)
        seen[key] = group
        groups.append(group)
    return groups
