"""Drawing the `hooktrace hooks` listing (analysis/listing.py decides what is in it)."""

from __future__ import annotations

from typing import Any

from ..analysis.listing import ModuleHooks
from ..ids import copy_of
from ..kinds import GLOBAL, MODULE_KINDS, OPTIMIZER_KINDS, REGISTRATION_KINDS, kinds_of
from ..schema import ROOT, Hook, Trace
from .badges import site
from .safe import safe_text as _s  # names from user code and files: no control sequence reaches a terminal


def flags(hook: Hook) -> str:
    words = []
    if hook.scope == GLOBAL:
        words.append(GLOBAL)
    if hook.prepend:
        words.append("prepend" if hook.prepend_source != "inferred" else "prepend (inferred)")
    if hook.with_kwargs:
        words.append("kwargs")
    if hook.always_call:
        words.append("always")
    return " ".join(f"[{w}]" for w in words)


def listing_text(trace: Trace, groups: list[ModuleHooks], live: set[int]) -> Any:
    """The listing as a rich Text: per module (the root is `<root>`, as in the tree), per kind, the
    hooks in firing order with where they are defined and registered."""
    from rich.text import Text

    types = {m.path: m.type for m in trace.modules}
    by_id = {h.id: h for h in trace.hooks}
    text = Text()
    text.append(f"Hooks of {_s(trace.meta.target)}, in the order PyTorch will fire them (nothing was run)\n")
    held = [h for h in trace.hooks if h.scope == GLOBAL and h.id in live]
    if not groups and not held:
        text.append("\nno hooks registered\n")
        return text
    if not groups:
        text.append("\nno module or tensor hooks registered\n")
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
                text.append(f"         registered {_registered(hook, by_id)}", style="dim")
                if hook.registered_by and hook.registered_by != hook.registered_at:
                    text.append(f"  by {site(hook.registered_by)}", style="dim")
                text.append("\n")
        if group.same:
            span = _s(group.same[0] if len(group.same) == 1 else f"{group.same[0]} … {group.same[-1]}")
            text.append(
                f"  ×{len(group.same)} more with the same hooks ({span}; --expand shows them)\n", "dim"
            )
    for kinds, says in _GLOBAL_LINES:
        n = sum(1 for h in held if h.kind in kinds)
        if n:
            text.append(f"\n{says.format(n=n)}\n", "dim")
    return text


# What global hooks of each family do: only module-call hooks fire for every module.
_GLOBAL_LINES = (
    (
        frozenset(MODULE_KINDS),
        "global module hooks ({n}) fire first for every module, also those not listed",
    ),
    (
        frozenset(REGISTRATION_KINDS),
        "global registration hooks ({n}) fire when any module registers a submodule, parameter or buffer",
    ),
    (
        frozenset(kinds_of(GLOBAL)) & frozenset(OPTIMIZER_KINDS),
        "global optimizer hooks ({n}) fire around every optimizer's step()",
    ),
)


def _registered(hook: Hook, by_id: dict[int, Hook]) -> str:
    """Where the hook was registered; for a deep copy's hook, that it was copied, and from where."""
    original = copy_of(hook.id)
    if original is None:
        return site(hook.registered_at) or "before capture"
    source = by_id.get(original)
    if source is None:
        return "copied with its module (copy.deepcopy)"
    module = "" if source.module is None else f" of {ROOT if source.module == '' else _s(source.module)}"
    at = (
        f" registered at {site(source.registered_at)}"
        if source.registered_at
        else " registered before capture"
    )
    return f"copied with its module (copy.deepcopy) from the hook{module}{at}"
