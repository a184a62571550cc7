"""What "the same hook" means across traces and ranks: one identity, used by `diff` and `ranks`.

Handle ids and file paths differ between runs and processes, so a hook is identified by what it is:
(scope, module, tensor, kind, name). Hooks with equal identities in one trace (a hook registered on
every step, the same function registered twice) are told apart by `occurrence`: their place in
registration order (handle ids only grow).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

from ..kinds import GLOBAL, MODULE, TENSOR
from ..schema import Hook, Trace

Identity = tuple[str, Optional[str], Optional[str], str, str]  # (scope, module, tensor, kind, name)


def identity(hook: Hook) -> Identity:
    """What a hook is, without run-specific values (handle id, paths, times)."""
    return (hook.scope, hook.module, hook.tensor, hook.kind, hook.name)


@dataclass(frozen=True)
class HookKey:
    """A hook as comparable across runs: its identity and its occurrence among equal identities."""

    scope: str
    module: Optional[str]
    tensor: Optional[str]
    kind: str
    name: str
    occurrence: int = 0

    @classmethod
    def of(cls, hook: Hook, occurrence: int = 0) -> HookKey:
        return cls(*identity(hook), occurrence=occurrence)

    @property
    def identity(self) -> Identity:
        return (self.scope, self.module, self.tensor, self.kind, self.name)

    def label(self) -> str:
        text = repr(self.name)
        if self.occurrence:
            text += f" #{self.occurrence + 1}"
        if self.scope == GLOBAL:
            text += " (global)"
        elif self.scope == TENSOR:
            text += f" (tensor hook on {self.tensor})" if self.tensor else " (tensor hook)"
        elif self.scope not in (MODULE, "unknown"):
            text += f" ({self.scope} hook on {self.tensor})" if self.tensor else f" ({self.scope} hook)"
        return text


def hook_keys(trace: Trace, canon: Optional[dict[HookKey, HookKey]] = None) -> dict[int, HookKey]:
    """Handle id -> HookKey, equal identities numbered in registration order (by handle id).

    Keys equal across the traces given the same `canon` dict are one object, so lists of keys compare
    by identity at C speed."""
    canon = {} if canon is None else canon
    seen: Counter[Identity] = Counter()
    keys: dict[int, HookKey] = {}
    for h in sorted(trace.hooks, key=lambda x: x.id):
        base = identity(h)
        key = HookKey(*base, occurrence=seen[base])
        keys[h.id] = canon.setdefault(key, key)
        seen[base] += 1
    return keys
