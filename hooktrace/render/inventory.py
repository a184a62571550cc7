"""Drawing the `hooktrace hooks` listing (analysis/inventory.py decides what is in it)."""

from __future__ import annotations

from typing import Any

from ..analysis.inventory import ModuleHooks
from ..kinds import GLOBAL
from ..schema import ROOT, Hook, Trace
from .badges import site
from .safe import safe_text as _s  # names from user code and files: no control sequence reaches a terminal


def flags(hook: Hook) -> str:
    words = []
    if hook.scope == GLOBAL:
        words.append("global")
    if hook.prepend:
        words.append("prepend" if hook.prepend_source != "inferred" else "prepend (inferred)")
    if hook.with_kwargs:
        words.append("kwargs")
    if hook.always_call:
        words.append("always")
    return " ".join(f"[{w}]" for w in words)


def inventory_text(trace: Trace, groups: list[ModuleHooks], live: set[int]) -> Any:
    """The listing as a rich Text: per module (the root is `<root>`, as in the tree), per kind, the
    hooks in firing order with where they are defined and registered."""
    from rich.text import Text

    types = {m.path: m.type for m in trace.modules}
    text = Text()
    text.append(f"Hooks of {_s(trace.meta.target)}, in the order PyTorch will fire them (nothing was run)\n")
    if not groups:
        text.append("\nno hooks registered\n")
        return text
    for group in groups:
        text.append(f"\n{ROOT if group.module == '' else _s(group.module)}", style="bold")
        text.append(f"  {_s(types.get(group.module, ''))}\n", style="dim")
        for row in group.rows:
            where = f" on {_s(row.tensor)}" if row.tensor else ""
            text.append(f"  {row.kind}{where}\n", style="cyan")
            for n, hook in enumerate(row.hooks, 1):
                text.append(f"    {n}. {_s(hook.name)}")
                shown = flags(hook)
                if shown:
                    text.append(f"  {shown}", style="yellow")
                text.append(f"\n         defined    {site(hook.defined_at) or '?'}\n", style="dim")
                text.append(
                    f"         registered {site(hook.registered_at) or 'before capture'}", style="dim"
                )
                if hook.registered_by and hook.registered_by != hook.registered_at:
                    text.append(f"  by {site(hook.registered_by)}", style="dim")
                text.append("\n")
        if group.same:
            span = _s(group.same[0] if len(group.same) == 1 else f"{group.same[0]} … {group.same[-1]}")
            text.append(
                f"  ×{len(group.same)} more with the same hooks ({span}; --expand shows them)\n", "dim"
            )
    n_global = sum(1 for h in trace.hooks if h.scope == GLOBAL and h.id in live)
    if n_global:
        text.append(
            f"\nglobal hooks ({n_global}) fire first for every module, also those not listed\n", "dim"
        )
    return text
