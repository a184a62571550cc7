"""Hooks are traced from outside their dicts: PyTorch's own code reads them through views.

The hook dicts of modules and the global ones are never modified while tracing, so code that
looks at them (pruning, weight norm, quantization `convert`, `torch.save`, `deepcopy`, other tools)
finds exactly what it registered. Instead, the `nn.Module` methods that read a hook dict to call its
hooks (`_call_impl`, `_get_backward_hooks`, `state_dict`, `load_state_dict`, the registration
methods, ...) run as copies made from their own source, identical but for one thing: each
`<hook dict>.items()` / `.values()` reads `hooktrace_view(<hook dict>, owner, "<attr>")` instead,
which returns the dict itself when no capture is active (or while Dynamo compiles) and otherwise a
plain dict with the same keys in the same order whose values are recording shims. The shims live
only in the lists PyTorch builds from that (`BackwardHook` keeps them for the backward pass).

The copies are compiled with the file name and line numbers of PyTorch's module, so tracebacks and
`inspect` read as usual. They are installed as class attributes of `nn.Module` for the block and
removed after it, but for `__setattr__`, whose copy's code goes into PyTorch's own function instead
(`_swap_dunder`: a dunder set on the class updates every subclass's slot); `Module.__call__` runs
the recording wrapper (capture/modulecall.py), which calls the `_call_impl` copy itself, so a
traced module level costs no extra Python frame.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from typing import Any, Callable, Optional, Protocol

import torch
import torch.nn.modules.module as nn_module

from .. import supported
from ..supported import UnsupportedTorch
from . import dicts
from .ledger import CURRENT, Ledger

# The global hook dicts and flags, read live from PyTorch's module, not from the copies' namespace:
# module.py rebinds some (`global X`), and code that resets the global hooks (PyTorch's own tests'
# tearDown, libraries) rebinds the dicts. Not inside a string or after a dot (already rewritten).
_REBOUND = re.compile(r'(?<![\w."])(_global_\w+)\b')
VIEW_NAME = "_hooktrace_view"
# `_call_impl`'s copy runs only from the recording wrapper, never under Dynamo (the wrapper hands
# compiling calls to PyTorch's own code), so it calls the capture's view directly: one call less.
FAST_VIEW_NAME = "_hooktrace_view_eager"
_MODULE_NAME = "_hooktrace_nn_module"
_CLASS_NAME = "_hooktrace_module_copies"
# a module's own attributes, which the copies' holder module keeps as its own
_MODULE_ATTRS = frozenset({"__name__", "__spec__", "__loader__", "__package__", "__path__"})


# The torch versions whose nn.Module / Optimizer source these rewrites were run or checked against
# (pyproject says the same; hooktrace/supported.py). Another version is traced if every rewrite still
# applies; if one does not, the capture refuses with UnsupportedTorch rather than trace half the hooks.
SUPPORTED_TORCH = supported.SUPPORTED_TORCH


def unsupported(what: str) -> UnsupportedTorch:
    return supported.refusal(torch.__version__, what)


def _source(fn: Any) -> tuple[list[str], int]:
    """PyTorch's source lines of `fn` and its first line number (tests replace this)."""
    return inspect.getsourcelines(fn)


class Viewer(Protocol):
    def view(self, d: dict, owner: Any, attr: str) -> dict: ...

    def forward_wrapper(self, module: Any, forward: Any) -> Any: ...


try:
    _is_compiling: Callable[[], bool] = torch.compiler.is_compiling
except AttributeError:  # torch < 2.3
    _is_compiling = getattr(getattr(torch, "_dynamo", None), "is_compiling", lambda: False)
if not hasattr(torch.compiler, "_compile_session_context"):  # torch < 2.13 (2.8 run)
    # is_compiling() is True only inside Dynamo's traced frames, not all through a compile as from
    # 2.13: AOTAutograd's own hooks (registered and fired while it traces) are then no user's; inside
    # a compile, Dynamo's CompileContext is set
    _torch_is_compiling = _is_compiling

    def _is_compiling() -> bool:
        if _torch_is_compiling():
            return True
        guards = sys.modules.get("torch._guards")
        return guards is not None and guards.CompileContext.try_get() is not None


def hooktrace_view(d: Any, owner: Any, attr: str) -> Any:
    """What PyTorch's copied code iterates instead of the hook dict `d` (see the module docstring)."""
    viewer = CURRENT.viewer
    if viewer is None or not d or _is_compiling():
        return d
    return viewer.view(d, owner, attr)


def _substitute(view: str) -> Callable[[re.Match], str]:
    def substitute(match: re.Match) -> str:
        owner, attr, glob, method = match.group("owner", "attr", "glob", "method")
        # an empty dict is read as it is, without a call (most modules and global dicts are empty)
        if glob is not None:
            return f'({view}({glob}, None, "{glob}") if {glob} else {glob}).{method}()'
        return f'({view}({owner}.{attr}, {owner}, "{attr}") if {owner}.{attr} else {owner}.{attr}).{method}()'

    return substitute


def reads(owners: str, attrs: tuple[str, ...], globs: str) -> re.Pattern:
    """`<owner>.<attr>.items()/.values()` or `<global dict>.items()/.values()`, as `_substitute` reads them."""
    return re.compile(
        rf"\b(?:(?P<owner>{owners})\.(?P<attr>" + "|".join(attrs) + r")"
        rf"|(?P<glob>{globs}))\.(?P<method>items|values)\(\)"
    )


def mentions(owners: str, attrs: tuple[str, ...], globs: str) -> re.Pattern:
    """Any naming of those hook dicts (`self._forward_hooks`, `_global_forward_hooks_always_called`)."""
    return re.compile(rf"\b(?:(?:{owners})\.(?:" + "|".join(attrs) + rf")|{globs})\b")


# A hook dict named but not read for its hooks: a truthiness test (`if self._forward_hooks or ...`)
# or a membership test (`hook_id in self._forward_hooks_with_kwargs`). Any other naming could call
# hooks past the view: the copy is refused rather than trace half of them.
_TESTED_BEFORE = re.compile(r"(?:\b(?:in|if|or|and|not)\s+|\b(?:if|not)\s*\()$")
_TESTED_AFTER = re.compile(r"\s*(?:\bor\b|\band\b|\)|:|$)")


def _unread_naming(line: str, read: re.Pattern, mention: re.Pattern) -> Optional[str]:
    """The first naming of a hook dict in `line` that is neither a `read` nor a test, or None."""
    spans = [m.span() for m in read.finditer(line)]
    for m in mention.finditer(line):
        if any(a <= m.start() < b for a, b in spans):
            continue
        if _TESTED_BEFORE.search(line, 0, m.start()) and _TESTED_AFTER.match(line, m.end()):
            continue
        return m.group()
    return None


_MODULE_ATTRS_READ = tuple(attr for attr, _ in dicts.MODULE_DICTS)
# `<receiver>.<attr>.items()` / `.values()` on a module hook dict, or `<_global_...>.items()/values()`.
_READ = reads("self|module", _MODULE_ATTRS_READ, "_global_[a-z_]+?_hooks")
_MENTION = mentions("self|module", _MODULE_ATTRS_READ, "_global_[a-z_]*?_hooks(?:_[a-z_]+)?")


def _plain(value: Any) -> Any:
    """The function behind a class attribute (staticmethod/classmethod unwrapped), else None."""
    fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    return fn if inspect.isfunction(fn) else None


class _Copies:
    """Rewritten copies of a class's hook-reading methods (those of `module`'s source), made once.

    `read` finds the hook-dict reads that go through `hooktrace_view`; `edits` are further
    (pattern, replacement) pairs applied line by line (the forward read of `_call_impl`);
    `names` are extra globals of the copies' namespace; the methods named in `fast` call
    FAST_VIEW_NAME (the capture's own `view` while one is installed) instead of `hooktrace_view`.
    `fast_edits` apply to those methods only (they never run while Dynamo compiles). `substitute`
    rewrites a `read` match in the other copies (default: a `hooktrace_view` call). Every rewrite
    is checked as it is made: the methods in `required` are copied, each dict named in `reads` is
    read somewhere, every other naming of a dict (`mention`) is only a truthiness or membership
    test, each edit applies, the copy compiles; else UnsupportedTorch.
    """

    def __init__(
        self,
        cls: type,
        module: Any,
        read: re.Pattern,
        edits: tuple[tuple[re.Pattern, str], ...] = (),
        names: Optional[dict[str, Any]] = None,
        fast: frozenset[str] = frozenset(),
        fast_edits: tuple[tuple[re.Pattern, str], ...] = (),
        substitute: Optional[Callable[[re.Match], str]] = None,
        required: frozenset[str] = frozenset(),
        reads: frozenset[str] = frozenset(),
        mention: Optional[re.Pattern] = None,
    ) -> None:
        self.originals: dict[str, Any] = {}
        self.copies: dict[str, Any] = {}
        self.namespace: dict[str, Any] = {}
        pieces: list[tuple[int, list[str]]] = []
        applied: dict[re.Pattern, int] = {}  # how often each edit applied
        seen: set[str] = set()  # the hook dicts read
        for name, value in vars(cls).items():
            fn = _plain(value)
            if fn is None or fn.__module__ != module.__name__:
                continue
            try:
                lines, first = _source(fn)
            except (OSError, TypeError):
                continue
            if not read.search("".join(lines)):
                continue
            self.originals[name] = value
            sub = _substitute(FAST_VIEW_NAME) if name in fast else substitute or _substitute(VIEW_NAME)
            out_lines = []
            own_edits = edits + fast_edits if name in fast else edits
            for line in lines:
                seen.update(m.group("attr") or m.group("glob") for m in read.finditer(line))
                other = _unread_naming(line, read, mention) if mention is not None else None
                if other is not None:
                    raise unsupported(
                        f"{cls.__name__}.{name} uses {other} in a way hooktrace cannot rewrite: {line.strip()!r}"
                    )
                line = read.sub(sub, line)
                for pattern, replacement in own_edits:
                    line, n = pattern.subn(replacement, line)
                    applied[pattern] = applied.get(pattern, 0) + n
                out_lines.append(line)
            pieces.append((first, out_lines))
        where = f"{cls.__name__}'s source in {module.__name__}"
        missing = sorted(required - set(self.originals))
        if missing:
            raise unsupported(f"{where} has no hook-dict reads in {', '.join(missing)} (or no source)")
        unread = sorted(reads - seen)
        if unread:
            raise unsupported(f"{where} has no read of {', '.join(unread)} that hooktrace can rewrite")
        unmatched = [p.pattern for p, _ in edits + fast_edits if not applied.get(p)]
        if unmatched and pieces:
            raise unsupported(f"{where} does not match the rewrite {unmatched[0]!r}")
        if not pieces:
            return
        pieces.sort()
        # One class body holding every copy at its own line numbers, so that `super()` has its cell
        # (pointed at `cls` below) and tracebacks name PyTorch's file and lines.
        out = [""] * (pieces[0][0] - 2) + [f"class {_CLASS_NAME}:"]
        for first, lines in pieces:
            out += [""] * (first - 1 - len(out))
            out += [line.rstrip("\n") for line in lines]
        # The copies' globals are a module of their own in sys.modules: Dynamo, inlining a copy
        # (`self.register_buffer(...)` or `self.x = ...` in a compiled forward), guards the names it
        # reads through `import(<globals' __name__>)`, which must find them (PyTorch's module has none).
        holder = types.ModuleType(f"_hooktrace_copies_of_{module.__name__.replace('.', '_')}")
        namespace = self.namespace = holder.__dict__
        namespace.update({k: v for k, v in vars(module).items() if k not in _MODULE_ATTRS})
        sys.modules[holder.__name__] = holder
        namespace[VIEW_NAME] = namespace[FAST_VIEW_NAME] = hooktrace_view
        namespace[_MODULE_NAME] = module
        namespace.update(names or {})
        try:
            code = compile("\n".join(out) + "\n", module.__file__ or "module.py", "exec")
        except SyntaxError as exc:
            raise unsupported(
                f"the rewritten copy of {where} does not compile ({exc.msg}, line {exc.lineno})"
            ) from exc
        exec(code, namespace)  # noqa: S102
        made = vars(namespace.pop(_CLASS_NAME))
        for name, original in self.originals.items():
            copy = made[name]
            fn, orig_fn = _plain(copy), _plain(original)
            if fn is not None and "__class__" in fn.__code__.co_freevars:  # zero-argument super()
                cell = fn.__closure__[fn.__code__.co_freevars.index("__class__")]
                cell.cell_contents = cls
            target = fn if fn is not None else copy
            target.__qualname__ = orig_fn.__qualname__
            target.__module__ = orig_fn.__module__
            target.__doc__ = orig_fn.__doc__
            if not hasattr(target, "__wrapped__"):  # a decorated copy keeps its own __wrapped__
                target.__dict__.update(orig_fn.__dict__)
            self.copies[name] = copy


# `self.forward` in `_call_impl`'s `forward_call = (...)`: a forward set on the instance is traced.
# (torch 2.8 to 2.14 test `torch._C._get_tracing_state()` there, torch 2.15 `torch._C._is_tracing()`.)
_FORWARD_READ = (
    re.compile(r"((?:_get_tracing_state|_is_tracing)\(\) else )self\.forward\b"),
    r'\1(_hooktrace_forward(self) if "forward" in self.__dict__ else self.forward)',
)


# `_call_impl`'s copy runs only when the wrapper has seen that Dynamo is not compiling (it hands
# those calls to PyTorch's own code): its own `is_compiling()` test is False, one call less.
_COMPILING_READ = (re.compile(r"^(\s*)if torch\.compiler\.is_compiling\(\):$"), r"\1if False:")
# The output of a module with full or legacy backward hooks is told to the capture (TensorNamer):
# tensor hooks registered on it later are named "output of" that module.
_OUTPUT_READS = (
    (
        re.compile(r"result = bw_hook\.setup_output_hook\(result\)"),
        "result = _hooktrace_output(self, bw_hook.setup_output_hook(result))",
    ),
    (
        re.compile(r"^(\s*)if non_full_backward_hooks:$"),
        r"\1if non_full_backward_hooks and _hooktrace_output(self, result) is result:",
    ),
)


def hooktrace_output(module: Any, result: Any) -> Any:
    """`result`, after telling the capture (if one is open) that `module` returned it."""
    on_output = CURRENT.on_output
    if on_output is not None:
        on_output(module, result)
    return result


def hooktrace_forward(module: Any) -> Any:
    """What `_call_impl`'s copy calls as `forward`: a recording shim when `forward` is the instance's own."""
    viewer = CURRENT.viewer
    md = module.__dict__
    # not a kind: "forward" is the attribute
    if viewer is None or "forward" not in md or _is_compiling():
        return module.forward  # not a capture
    if "_orig_mod" in md.get("_modules", ()):  # torch.compile(m)'s own forward (the call is recorded)
        run = CURRENT.run_compiled  # modulecall.make_module_call's
        if run is None:
            return module.forward
        compiled, inner = md["forward"], md["_modules"]["_orig_mod"]  # not a kind: the method

        def hooktrace_compiled_forward(*args: Any, **kwargs: Any) -> Any:
            return run(inner, compiled, args, kwargs)  # m's own `__call__` in it: its hooks are traced

        return hooktrace_compiled_forward
    forward = md["forward"]  # not a kind: the method set on the instance
    if getattr(forward, "__self__", None) is module and getattr(forward, "__func__", None) is getattr(
        type(module), "forward", None
    ):
        return forward  # the class's own forward bound on the instance (accelerate's remove_hook_from_module)
    return viewer.forward_wrapper(module, forward)


_made: Optional[_Copies] = None
# the methods that call hooks: each must be copied, or their hooks would run untraced
_MODULE_METHODS = frozenset(
    {
        "_call_impl",
        "_get_backward_hooks",
        "_get_backward_pre_hooks",
        "state_dict",  # not a kind: a method name
        "_load_from_state_dict",
        "load_state_dict",
        "register_buffer",
        "register_parameter",
        "add_module",
        "__setattr__",
    }
)


def copies() -> _Copies:
    """The copies (made once); first, UnsupportedTorch for a torch older than 2.8 (supported.require)."""
    global _made
    supported.require()
    if _made is None:
        _made = _Copies(
            torch.nn.Module,
            nn_module,
            _READ,
            ((_REBOUND, _MODULE_NAME + r".\1"), _FORWARD_READ, *_OUTPUT_READS),
            {"_hooktrace_forward": hooktrace_forward, "_hooktrace_output": hooktrace_output},
            frozenset({"_call_impl"}),
            (_COMPILING_READ,),
            required=_MODULE_METHODS,
            reads=frozenset(attr for attr, _ in dicts.MODULE_DICTS + dicts.GLOBAL_DICTS),
            mention=_MENTION,
        )
    return _made


def install(
    viewer: Viewer, module_call: Callable[..., Any], on_output: Callable[[Any, Any], None], ledger: Ledger
) -> None:
    """The copies on `nn.Module` for one capture, recorded in `ledger` (the `__call__` wrapper:
    modulecall.install)."""
    made = copies()
    start = ledger.mark()
    ledger.claim("viewer", viewer, "views")
    try:
        ledger.set(CURRENT, "on_output", on_output)
        ledger.set(CURRENT, "run_compiled", getattr(module_call, "run_compiled", None))
        ledger.set_item(made.namespace, FAST_VIEW_NAME, viewer.view)  # back to the inert hooktrace_view
        for name, copy in made.copies.items():
            if name == "_call_impl":  # the `__call__` wrapper calls it; `_call_impl` stays PyTorch's
                continue
            if not _swap_dunder(made, name, copy, ledger):
                ledger.set(torch.nn.Module, name, copy)
    except BaseException:
        ledger.restore(to=start)
        raise


def _swap_dunder(made: _Copies, name: str, copy: Any, ledger: Ledger) -> bool:
    """Put the copy of a dunder method (`__setattr__`) in PyTorch's own function by its code; False
    where it cannot (not a dunder, or the function there is not the one the copy was made from).

    Setting a dunder on `nn.Module` updates the type slot of every subclass (about 360 once torch is
    imported), about 0.1 ms at the block's start and again at its end, for every session; a code swap
    costs what any attribute does, and `nn.Module.__setattr__` stays PyTorch's object. The function's
    globals are then PyTorch's module's: the names the copy reads that it has not (the view, and
    the module its global hook dicts are read from) are set there for the block, restored with it.
    """
    if not (name.startswith("__") and name.endswith("__")):
        return False
    own = vars(torch.nn.Module).get(name)
    if own is None or own is not made.originals.get(name) or _plain(own) is not own:
        return False
    code, theirs = copy.__code__, vars(nn_module)
    if code.co_freevars != own.__code__.co_freevars or own.__globals__ is not theirs:
        return False
    for read in sorted(_names_read(code)):
        if read not in theirs and read in made.namespace:
            ledger.set_item(theirs, read, made.namespace[read])
    ledger.swap_code(own, code)
    return True


def _names_read(code: types.CodeType) -> set[str]:
    """Every name `code` and the functions defined in it read (globals among them)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
    return names


def call_impl_copy() -> Any:
    """The copy of `Module._call_impl` that reads hooks through views (or PyTorch's own if none)."""
    return copies().copies.get("_call_impl", vars(torch.nn.Module)["_call_impl"])
