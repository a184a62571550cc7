"""The pytest plugin (docs/contract.md, In a test suite), installed with hooktrace (entry point `pytest11`): lock hook order in tests.

    def test_lora_order(hook_order):
        model = make_model()
        with hook_order(model):                  # traces as hooktrace.trace(model) does
            model(x).sum().backward()            # on exit: compared with the snapshot

The snapshot is `__hooktrace__/<test file stem>/<test name>.txt` beside the test file, in the order
format; `pytest --hooktrace-update` writes it. Loading this plugin imports neither torch nor the
rest of hooktrace: a test suite that never asks for `hook_order` pays nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import pytest

if TYPE_CHECKING:
    from .capture import TraceSession
    from .compare import Side
    from .schema import Trace

SNAPSHOTS = "__hooktrace__"
UPDATE = "--hooktrace-update"
_PROPERTY = "hooktrace snapshot"  # user_properties key: what happened to a snapshot (travels with xdist)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,\[\]-]")
_MAX_NAME = 120
_LOOKS_HASHED = re.compile(r"(-[0-9a-f]{8}|\.[0-9]+)$")  # a hashed name, or a later block's `.N`


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hooktrace", "hook order snapshots (hooktrace)")
    group.addoption(
        UPDATE,
        action="store_true",
        default=False,
        help=f"write the hook_order snapshots ({SNAPSHOTS}/<test file>/<test>.txt) instead of comparing.",
    )


def snapshot_name(nodeid: str) -> str:
    """The file name (without .txt) of a test's snapshot: its name after the file (a class's tests as
    `Class.test`), with parametrize ids kept. A short hash of the real name is added whenever the name
    had to be changed (characters not safe in file names on every system become `_`; `::` inside an
    id; too long), could be read two ways (a `.` before the ids), holds an upper-case letter (macOS
    and Windows file systems ignore case), or ends as a hashed name or a block's `.N` does; so two
    tests never share a file, on any file system."""
    name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    head, bracket, ids = name.partition("[")
    dotted = head.replace("::", ".") + bracket + ids
    safe = _UNSAFE.sub("_", dotted)
    if (
        safe != dotted
        or "." in head
        or name != name.lower()
        or len(safe) > _MAX_NAME
        or safe.startswith(".")
        or _LOOKS_HASHED.search(safe)
    ):
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe.lstrip('.')[:_MAX_NAME]}-{digest}"
    return safe


class HookOrder:
    """The `hook_order` fixture: `with hook_order(model) as session:` traces the block as
    `hooktrace.trace(model)` does (`hook_order()` without a model as `hooktrace.trace()`), then
    compares its order with the test's snapshot, or writes it under `--hooktrace-update`."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._update = bool(request.config.getoption(UPDATE))
        folder = Path(str(request.node.path)).parent if hasattr(request.node, "path") else Path.cwd()
        stem = Path(str(getattr(request.node, "path", "tests"))).stem
        self.folder = folder / SNAPSHOTS / stem
        self.name = snapshot_name(request.node.nodeid)
        self._blocks = 0

    def snapshot_path(self, block: int = 1) -> Path:
        """The snapshot of the test's `block`-th `with hook_order(...)` (the second is `<name>.2.txt`)."""
        return self.folder / (f"{self.name}.txt" if block == 1 else f"{self.name}.{block}.txt")

    @contextlib.contextmanager
    def __call__(self, model: Optional[Any] = None, *, shapes: bool = False) -> Iterator[TraceSession]:
        """`shapes=True`: the session's events also carry what each hook received and returned (the
        snapshot, in the order format, never holds them)."""
        import hooktrace

        self._blocks += 1
        path = self.snapshot_path(self._blocks)
        with hooktrace.trace(model, shapes=shapes) as session:
            yield session
        self.check(session.trace, path)  # not reached when the block raised: that error is the test's

    def check(self, trace: Trace, path: Path) -> None:
        from .compare import Side, compare_sides, failure_message
        from .render.order import order_text

        text = order_text(trace)
        shown = self._shown(path)
        if path.exists() and not path.is_file():
            what = "a folder" if path.is_dir() else "not a regular file"
            pytest.fail(
                f"the snapshot path {shown} is {what}, not a file: remove it, then run pytest {UPDATE}",
                pytrace=False,
            )
        if self._update:
            self._write(path, text, shown)
            return
        if not path.is_file():
            pytest.fail(
                f"no hook-order snapshot {shown} for this test: run pytest {UPDATE} to write it, "
                "then review and commit it",
                pytrace=False,
            )
        raw = path.read_bytes()
        if raw == text.encode("utf-8"):
            return
        expected = self._read(raw, shown)
        observed = Side(trace, False, "this run")
        result = compare_sides(expected, observed)
        if result.equal:
            return  # the same lines, headers or blank lines aside (a hand-edited snapshot)
        pytest.fail(
            f"hook order differs from the snapshot {shown} (pytest {UPDATE} rewrites it)\n\n"
            + failure_message(expected, observed, result),
            pytrace=False,
        )

    @staticmethod
    def _read(raw: bytes, shown: str) -> Side:
        """The snapshot as one side of the comparison, or a failure that says to rewrite it."""
        from .compare import Side
        from .render.order import OrderFormatError, parse_order

        try:
            text = raw.decode("utf-8-sig")  # an editor's byte-order mark is no difference
            return Side(parse_order(text, as_file=True), True, shown, text)
        except (UnicodeDecodeError, OrderFormatError) as exc:
            why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        why = why[len("not an order file: ") :] if why.startswith("not an order file: ") else why
        pytest.fail(
            f"the snapshot {shown} is not an order file ({why}); rewrite it with pytest {UPDATE}",
            pytrace=False,
        )

    def _shown(self, path: Path) -> str:
        """`path` relative to the rootdir when under it."""
        try:
            return str(path.relative_to(self._request.config.rootpath))
        except ValueError:
            return str(path)

    def _write(self, path: Path, text: str, shown: str) -> None:
        from .io import write_atomic

        if path.is_file() and path.read_bytes() == text.encode("utf-8"):
            self._request.node.user_properties.append((_PROPERTY, "unchanged"))
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)  # one file per test, renamed into place: safe under pytest-xdist
        self._request.node.user_properties.append((_PROPERTY, f"wrote {shown}"))


@pytest.fixture
def hook_order(request: pytest.FixtureRequest) -> HookOrder:
    """`with hook_order(model): ...` traces the block and compares its hook order with the test's
    snapshot `__hooktrace__/<test file stem>/<test name>.txt` (`pytest --hooktrace-update` writes it)."""
    return HookOrder(request)


class _Summary:
    """Counts the snapshots written under --hooktrace-update (from every xdist worker's reports)."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.unchanged = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == _PROPERTY:
                if value == "unchanged":
                    self.unchanged += 1
                else:
                    self.written.append(str(value)[len("wrote ") :])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written or self.unchanged:
            terminalreporter.write_line(
                f"hooktrace: {len(self.written)} snapshot(s) written, {self.unchanged} unchanged"
            )
            for shown in sorted(self.written):
                terminalreporter.write_line(f"  {shown}")


def pytest_ignore_collect(collection_path: Path) -> Optional[bool]:
    """Snapshot folders hold no tests: pytest's doctest plugin would read `test*.txt` in them as
    doctest files (a snapshot that is not UTF-8 was a collection error before any test ran)."""
    return True if collection_path.name == SNAPSHOTS else None


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(UPDATE, default=False):
        config.pluginmanager.register(_Summary(), "hooktrace-snapshot-summary")
