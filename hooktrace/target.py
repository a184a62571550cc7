"""TARGET string -> factory: import the file or module, find NAME in it (docs/contract.md, The factory).

What the factory returns is turned into a runnable model by `hooktrace.inputs`. torch is not
imported here, so a missing file or name is reported before torch loads.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from .options import UsageError

__all__ = ["DEFAULT_NAME", "Factory", "UsageError", "load_factory", "split_spec"]

DEFAULT_NAME = "make"
TRACEBACK_HINT = " (--traceback shows where)"


# -- TARGET string -> factory -----------------------------------------------------------------


@dataclass
class Factory:
    """A loaded factory: `factory()` calls it with the target's folder first on `sys.path`."""

    spec: str  # normalised "where:NAME"
    func: Callable[[], Any]
    label: str  # "make()" or "Builder.make()", for messages
    path_entry: Optional[str] = None
    script: bool = False  # its module has a __main__ guard, or NAME is `main`: likely a script

    def __call__(self) -> Any:
        with self.on_sys_path():
            return self.func()

    def on_sys_path(self) -> contextlib.AbstractContextManager[None]:
        """The target's folder first on `sys.path` (for a whole run, as `python FILE.py` keeps it)."""
        return _first_on_sys_path(self.path_entry)


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


def exec_command(spec: str) -> str:
    """The `hooktrace exec` command that runs TARGET's file or module as a script."""
    where = spec.rpartition(":")[0] if ":" in spec and not _is_file_spec(spec.rpartition(":")[2]) else spec
    return f"hooktrace exec {where}" if _is_file_spec(where) else f"hooktrace exec -m {where}"


def _is_script(module: Any) -> bool:
    """The module runs its work under `if __name__ == "__main__":` (a script, not a factory's home)."""
    import ast

    try:
        tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    except (OSError, SyntaxError, TypeError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names):
                return True
    return False


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
        raise UsageError(f"file not found: {path}{_close_files(path)}; give the path to a .py file")
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
        hint = _sibling_hint(exc, path, file_form=True) or "fix the import" + TRACEBACK_HINT
        raise UsageError(f"importing {path} raised {type(exc).__name__}: {exc}; {hint}") from exc
    except SystemExit as exc:
        sys.modules.pop(name, None)
        raise UsageError(
            f"importing {path} called sys.exit({exc.code!r}); keep the script's main code under "
            "if __name__ == '__main__':"
        ) from exc
    return module


def _close_files(path: str) -> str:
    """ "; did you mean x.py?" for a missing file whose name is close to one in its folder."""
    folder, name = os.path.split(path)
    try:
        here = [n for n in os.listdir(folder) if n.endswith(".py") or os.path.isdir(os.path.join(folder, n))]
    except OSError:
        return ""
    close = difflib.get_close_matches(name, here, n=3, cutoff=0.6)
    if not close:
        return ""
    shown = [os.path.relpath(os.path.join(folder, n)) if os.path.isabs(path) else n for n in close]
    return f" (did you mean {' or '.join(shown)}?)"


def _sibling_hint(exc: BaseException, target_file: Optional[str], *, file_form: bool) -> Optional[str]:
    """When the module an import could not find is a file beside the target, say why it was not used."""
    if not isinstance(exc, ImportError) or not exc.name or target_file is None:
        return None
    missing = exc.name.split(".")[0]
    folder = os.path.dirname(os.path.abspath(target_file))
    sibling = next(
        (
            p
            for p in (os.path.join(folder, missing + ".py"), os.path.join(folder, missing))
            if os.path.exists(p)
        ),
        None,
    )
    if sibling is None:
        return None
    shown = os.path.relpath(sibling)
    loaded = sys.modules.get(missing)
    origin = getattr(loaded, "__file__", None) or exc.path
    if (
        origin
        and os.path.abspath(origin) != os.path.abspath(sibling)
        and not isinstance(exc, ModuleNotFoundError)
    ):
        return (
            f"{shown} is beside the target, but the {missing!r} Python found is {origin}, which shadows it; "
            f"rename {shown} or the other one"
        )
    if not file_form and isinstance(exc, ModuleNotFoundError) and exc.name == missing:
        return (
            f"{shown} is beside the target, but a package.module target does not put its folder on sys.path; "
            f"import it relatively (from . import {missing}) or give the file: "
            f"hooktrace run {os.path.relpath(target_file)}:NAME"
        )
    if isinstance(exc, ModuleNotFoundError) and exc.name != missing and os.path.isfile(sibling):
        return f"{shown} is beside the target: a file, not a package, so {exc.name!r} is not in it"
    return None


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
            hint = _sibling_hint(exc, _module_file(dotted), file_form=False) or "install the missing package"
            raise UsageError(f"importing {dotted} raised ModuleNotFoundError: {exc}; {hint}") from exc
        except Exception as exc:
            hint = (
                _sibling_hint(exc, _module_file(dotted), file_form=False) or "fix the import" + TRACEBACK_HINT
            )
            raise UsageError(f"importing {dotted} raised {type(exc).__name__}: {exc}; {hint}") from exc
        except SystemExit as exc:
            raise UsageError(f"importing {dotted} called sys.exit({exc.code!r}); fix the module") from exc


def _module_file(dotted: str) -> Optional[str]:
    """The file `dotted` would be imported from, without running it (its packages are imported)."""
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def _public(obj: Any, *, functions_only: bool = False) -> list[str]:
    names = []
    for n in dir(obj):
        if n.startswith("_"):
            continue
        try:
            v = getattr(obj, n)
        except Exception:  # noqa: BLE001  (a property that raises is just not listed)
            continue
        if not callable(v):
            continue
        if functions_only and (isinstance(v, type) or getattr(v, "__module__", None) != obj.__name__):
            continue
        names.append(n)
    return sorted(names)


def _missing_name(owner: str, obj: Any, part: str, is_module: bool) -> UsageError:
    """`owner has no attribute 'x'`, with close names, or the callables that are there."""
    everything = [n for n in dir(obj) if not n.startswith("_")]
    close = difflib.get_close_matches(part, everything, n=3, cutoff=0.6)
    if close:
        hint = f"did you mean {' or '.join(repr(n) for n in close)}?"
    elif is_module:
        names = _public(obj, functions_only=True)
        hint = f"functions defined there: {', '.join(names[:8]) if names else 'none'}"
    else:
        names = _public(obj)
        hint = f"its callable attributes: {', '.join(names[:12]) if names else 'none'}"
    return UsageError(f"{owner} has no attribute {part!r} ({hint}); give an existing NAME after ':'")


def load_factory(spec: str) -> Factory:
    """Import the file or module named by TARGET and find NAME (dotted) in it. Raises UsageError."""
    where, name = split_spec(spec)
    path_entry = None
    if _is_file_spec(where):
        module = _import_file(where)
        path_entry = os.path.dirname(os.path.abspath(where))
    else:
        module = _import_module(where)
    origin = where
    obj: Any = module
    parts = name.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            owner = origin if i == 0 else ".".join(parts[:i])
            if i == 0 and _is_script(module):
                raise UsageError(
                    f"this is a script: `{exec_command(where)}` (it has a __main__ guard and no "
                    f"{part!r}; run traces a model factory: give FILE.py:NAME)"
                )
            raise _missing_name(owner, obj, part, is_module=i == 0)
        obj = getattr(obj, part)
    if _is_module_instance(obj):
        raise UsageError(
            f"{origin}:{name} is a model instance, not a factory; wrap it in a function, "
            f"e.g. def make(): return {parts[-1]}"
        )
    if not callable(obj):
        raise UsageError(f"{origin}:{name} is a {type(obj).__name__}, not callable; give a factory function")
    script = parts[-1] == "main" or _is_script(module)
    return Factory(spec=f"{where}:{name}", func=obj, label=f"{name}()", path_entry=path_entry, script=script)


def _is_module_instance(obj: Any) -> bool:
    nn = sys.modules.get("torch.nn")
    return nn is not None and isinstance(obj, nn.Module)
