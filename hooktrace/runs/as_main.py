"""Run a script as `python SCRIPT.py ARGS` runs it, or a module as `python -m MODULE ARGS` does.

What the script sees is what python gives it: `sys.argv` as typed (`argv[0]` the path as given, a
module's file for `-m`), its folder first on `sys.path`, a `__main__` module whose globals are
python's (`__file__`, `__loader__`, `__spec__`, `__package__`, the `builtins` module), and nothing
put back into `sys.argv` afterwards (runpy's `run_path` / `run_module(alter_sys=True)` restore
`argv[0]` and fail with IndexError when the script emptied `sys.argv`).

A file is read once, as python reads it: a pipe (`hooktrace exec <(...)`, a `/dev/fd/N` path) runs
as it does under python (runpy's importer probe read it first, and the script ran empty). A folder
or a zip file (a `__main__.py` inside) goes to runpy as before.

`-m pkg.sub`: the parent packages are imported when the script runs (inside exec's watch, as user
code: an exception there is the script's, exit 1); a module that is not there is a `NotFound`
(exit 2, one `error:` line), said before anything runs when its top-level package is missing.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import marshal
import os
import runpy
import stat
import sys
import types
import zipfile
from typing import Any, Optional

from ..options import UsageError


class NotFound(UsageError):
    """The module `-m` names cannot be found (python: "No module named ...", exit 1; here exit 2)."""


def check_module(name: str) -> None:
    """UsageError for a module whose top-level package cannot be found, before any user code runs:
    nothing is imported here (a package's `__init__` runs when the script runs, watched)."""
    top = name.split(".", 1)[0]
    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(top) if top and not name.startswith(".") else None
    except (ImportError, ValueError) as exc:
        raise NotFound(f"cannot find module {name!r}: {exc}") from exc
    finally:
        sys.path.pop(0)
    if found is None:
        raise NotFound(f"no module named {name!r}; run from the folder that holds it, or give SCRIPT.py")


class MainState:
    """`sys.argv`, `sys.path[0]` and `sys.modules["__main__"]` as python sets them for the script;
    the caller's put back afterwards."""

    def __init__(self, path: Optional[str], module: Optional[str], args: tuple[str, ...]) -> None:
        self.path, self.module, self.args = path, module, args
        self._argv: list[str] = []
        self._path0: Optional[str] = None
        self._main: Any = None

    def __enter__(self) -> MainState:
        self._argv = sys.argv
        self._path0 = sys.path[0] if sys.path else None
        self._main = sys.modules.get("__main__")
        first = os.getcwd() if self.module is not None else os.path.dirname(os.path.abspath(str(self.path)))
        if sys.path:
            sys.path[0] = first
        else:
            sys.path.append(first)
        # `-m`: argv[0] becomes the module's file once it is found (`run_main`), as python does
        sys.argv = [str(self.path) if self.module is None else "-m", *self.args]
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.argv = self._argv
        if self._path0 is not None and sys.path:
            sys.path[0] = self._path0
        if self._main is not None:
            sys.modules["__main__"] = self._main


def run_main(path: Optional[str], module: Optional[str]) -> None:
    """Run the script (`path`) or module as `__main__`, inside `MainState`."""
    if module is not None:
        _run_module(module)
    else:
        _run_file(str(path))


def _run_file(given: str) -> None:
    path = os.path.abspath(given)  # python gives `__main__` its absolute path (`__file__`, frames)
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and zipfile.is_zipfile(path)):
        runpy.run_path(path, run_name="__main__")  # its `__main__.py`, found as python finds it
        return
    with io.open_code(path) as f:  # once: a pipe gives its bytes to one reader only
        data = f.read()
    if data[:4] == importlib.util.MAGIC_NUMBER:  # a compiled .pyc, which python runs too
        code = marshal.loads(data[16:])
    else:
        code = compile(data, path, "exec", dont_inherit=True)
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    _run_code(code, file=path, loader=loader, spec=None)


def _run_module(name: str) -> None:
    details = getattr(runpy, "_get_module_details", None)
    if details is None:  # a Python without runpy's helper: its public function, as before
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        return
    # imports the parent packages (user code: what they raise is the script's), then finds the module
    # (a package: its __main__), as `python -m` does; what cannot be found is a NotFound
    _, spec, code = details(name, NotFound)
    sys.argv[0] = spec.origin
    _run_code(code, file=spec.origin, loader=spec.loader, spec=spec)


def _run_code(code: Any, *, file: Optional[str], loader: Any, spec: Any) -> None:
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=file,
        __cached__=spec.cached if spec is not None and spec.has_location else None,
        __loader__=loader,
        __package__=spec.parent if spec is not None else None,
        __spec__=spec,
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main  # MainState puts the caller's back
    exec(code, main.__dict__)
