"""`--hide-library` and `--hide GLOB`: a trace without some hooks, for renderings only.

The trace file keeps everything; every other rendering draws `hide(trace, ...)`, whose `hidden`
attribute (`hidden_of`) says how many hooks and hook calls were left out, so each picture can say so.

A hook is a library's when the code it runs is defined in torch or in an installed package (its
`defined_at` is a path relative to a site-packages folder: `torch/utils/checkpoint.py:1123`), or in
Python's own library. A file of the user's (`train.py:90`, `mylib/hooks.py:5` in the working folder,
an absolute path outside Python's install, a notebook cell) is not, whatever registered it.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.machinery
import os
import sys
import sysconfig
from dataclasses import dataclass, replace
from typing import Iterable, Optional

from ..ids import family
from ..kinds import HOOK, SAVED_TENSORS
from ..schema import Hook, Surprise, Trace
from .firings import firings

# Always a library, also when the trace is drawn where they are not installed.
KNOWN_LIBRARIES = frozenset({"torch", "torchvision", "torchaudio", "transformers", "accelerate", "peft",
                             "lightning", "pytorch_lightning", "deepspeed", "torchao", "hooktrace"})  # fmt: skip


@dataclass(frozen=True)
class Hidden:
    """What a view left out: hooks and their calls, and why (`--hide-library`, `--hide GLOB`)."""

    hooks: int
    calls: int
    why: str  # "--hide-library", "--hide '*pack*'", or both

    def phrase(self) -> str:
        """`hidden: 24 hook calls of 3 hooks (--hide-library)`, the words of every rendering."""
        calls = f"{self.calls} hook call{'' if self.calls == 1 else 's'}"
        hooks = f"{self.hooks} hook{'' if self.hooks == 1 else 's'}"
        return f"hidden: {calls} of {hooks} ({self.why})"


def _python_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


def _install_dirs() -> list[str]:
    """Where installed packages live: Python's own library and the site-packages folders."""
    return [d.rstrip(os.sep) for d in _python_dirs()] + [
        p for p in map(os.path.abspath, sys.path) if os.path.basename(p) in ("site-packages", "dist-packages")
    ]


@functools.lru_cache(maxsize=1024)
def _installed(top: str) -> bool:
    """A top-level module name found in Python's install folders (an installed package). Only those
    are searched: a `train.py` that sys.path or sys.modules holds from elsewhere is no library."""
    if top in KNOWN_LIBRARIES:
        return True
    if not top.isidentifier():
        return False
    return importlib.machinery.PathFinder.find_spec(top, _install_dirs()) is not None


def is_library_file(defined_at: Optional[str]) -> bool:
    """Whether a `defined_at` (`file:line`, as the trace holds it) is library code (module docstring)."""
    if not defined_at or defined_at.startswith(("<", "In [")):
        return False
    path = defined_at.rsplit(":", 1)[0] if defined_at.rsplit(":", 1)[-1].isdigit() else defined_at
    if os.path.isabs(path):
        return any(os.path.abspath(path).startswith(d) for d in _python_dirs())
    top = path.replace("\\", "/").split("/", 1)[0]
    return _installed(top.removesuffix(".py"))


def matches(hook: Hook, globs: Iterable[str]) -> bool:
    """`--hide GLOB`: the hook's name, or its defining file (`fancylib.py`, `fancylib.py:5`, the
    file's base name) matches one of the globs."""
    names = [hook.name, hook.name.rsplit(".", 1)[-1]]
    if hook.defined_at:
        file = hook.defined_at.rsplit(":", 1)[0]
        names += [hook.defined_at, file, file.replace("\\", "/").rsplit("/", 1)[-1]]
    return any(fnmatch.fnmatchcase(n, g) for g in globs for n in names)


def _torch_saved_tensors(hook: Hook) -> bool:
    """PyTorch's own saved-tensor hooks (checkpoint's pack/unpack): their counts follow its internals."""
    return hook.scope == SAVED_TENSORS and (hook.defined_at or "").startswith("torch/")


def hide(
    trace: Trace, *, library: bool = False, globs: Iterable[str] = (), torch_saved_tensors: bool = True
) -> Trace:
    """`trace` without the hooks `--hide-library` / `--hide GLOB` name (and PyTorch's own saved-tensor
    hooks when `torch_saved_tensors` is False), nor their calls; module calls, the other hooks and the
    surprises about them stay. The trace itself is not changed."""
    globs = tuple(globs)
    if not library and not globs and torch_saved_tensors:
        return trace
    gone = {
        h.id
        for h in trace.hooks
        if (library and is_library_file(h.defined_at))
        or matches(h, globs)
        or (not torch_saved_tensors and _torch_saved_tensors(h))
    }
    events = [e for e in trace.events if not (e.type == HOOK and e.hook in gone)]
    seqs = {e.seq for e in events}
    surprises = [
        Surprise(
            s.rule,
            s.message,
            [h for h in s.hooks if h not in gone],
            [q for q in s.events if q in seqs],
            s.level,
        )  # fmt: skip
        for s in trace.surprises
        if not (s.hooks and all(h in gone for h in s.hooks))
    ]
    out = Trace(trace.meta, trace.modules, [h for h in trace.hooks if h.id not in gone], events, surprises)
    why = (["--hide-library"] if library else []) + [f"--hide {g!r}" for g in globs]
    why += [] if torch_saved_tensors else ["PyTorch's saved-tensor hooks"]
    out.hidden = Hidden(len(gone), len(trace.events) - len(events), ", ".join(why))  # type: ignore[attr-defined]
    return out


def hidden_of(trace: Trace) -> Optional[Hidden]:
    """What `hide` left out of this trace; None for a trace shown whole."""
    return getattr(trace, "hidden", None)


def prepend_as_seen(trace: Trace) -> Trace:
    """`trace` with `prepend` kept only where the order shows it: the hook fired before a hook of the
    same dict registered earlier (a smaller handle id), as `prepend (inferred)` is found for hooks
    registered before a capture. A lone `prepend=True` hook then reads the same whether it was
    registered inside the traced block (flag known) or before it (flag unknowable)."""
    by_id = {h.id: h for h in trace.hooks}
    seen: set[int] = set()
    for firing in firings(trace):
        hooks = [by_id[e.hook] for e in firing if e.hook in by_id]
        for i, h in enumerate(hooks):
            if h.prepend and any(
                g.scope == h.scope and family(g.id) == family(h.id) and g.id < h.id for g in hooks[i + 1 :]
            ):
                seen.add(h.id)
    if all(h.id in seen for h in trace.hooks if h.prepend):
        return trace
    hooks = [h if not h.prepend or h.id in seen else replace(h, prepend=False, prepend_source=None)
             for h in trace.hooks]  # fmt: skip
    return Trace(trace.meta, trace.modules, hooks, trace.events, trace.surprises)
