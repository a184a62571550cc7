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
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import pytest

if TYPE_CHECKING:
    from .capture import TraceSession
    from .compare import Side
    from .schema import Trace

SNAPSHOTS = "__hooktrace__"
UPDATE = "--hooktrace-update"
REMOVE_STALE = "--hooktrace-remove-stale"
_PROPERTY = "hooktrace snapshot"  # user_properties key: what happened to a snapshot (travels with xdist)
_USED = "hooktrace snapshot used"  # user_properties key: the snapshot file a block compared or wrote
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,\[\]-]")
_MAX_NAME = 120
_LOOKS_HASHED = re.compile(r"(-[0-9a-f]{8}|\.[0-9]+)$")  # a hashed name, or a later block's `.N`


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hooktrace", "hook order snapshots (hooktrace)")
    group.addoption(
        UPDATE,
        action="store_true",
        default=False,
        help=f"write the hook_order snapshots ({SNAPSHOTS}/<test file>/<test>.txt) instead of comparing; "
        "lists stale ones (of no collected test).",
    )
    group.addoption(
        REMOVE_STALE,
        action="store_true",
        default=False,
        help=f"remove the stale hook_order snapshots (in {SNAPSHOTS} folders of the test files collected, "
        "of no collected test); not under pytest-xdist.",
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
    def __call__(
        self,
        model: Optional[Any] = None,
        *,
        shapes: bool = False,
        hide_library: bool = False,
        hide: Sequence[str] = (),
        torch_saved_tensors: bool = True,
    ) -> Iterator[TraceSession]:
        """`shapes=True`: the session's events also carry what each hook received and returned (the
        snapshot, in the order format, never holds them). `hide_library`, `hide`: leave out of the
        snapshot hooks defined in torch or installed packages, or matching a glob on their name or
        defining file (as `--hide-library`, `--hide GLOB`); `torch_saved_tensors=False`: leave out
        PyTorch's own saved-tensor hooks (checkpoint's pack/unpack), whose counts follow its
        internals. The session's trace keeps everything."""
        import hooktrace

        self._blocks += 1
        path = self.snapshot_path(self._blocks)
        with hooktrace.trace(model, shapes=shapes) as session:
            yield session
        hiding = dict(library=hide_library, globs=tuple(hide), torch_saved_tensors=torch_saved_tensors)
        self.check(session.trace, path, hiding)  # not reached when the block raised: that error is the test's

    def check(self, trace: Trace, path: Path, hiding: Optional[dict[str, Any]] = None) -> None:
        from .analysis.hiding import hide, prepend_as_seen
        from .compare import Side, compare_sides, failure_message
        from .render.order import order_text

        # a snapshot must not depend on where the model was built: `prepend` only where the order shows it
        trace = prepend_as_seen(hide(trace, **(hiding or {})))
        self._request.node.user_properties.append((_USED, str(path)))
        text = order_text(trace)
        shown = self._shown(path)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            # a link is refused as a FIFO is: writing through it would overwrite a file outside the tests
            what = (
                "a symbolic link"
                if path.is_symlink()
                else "a folder"
                if path.is_dir()
                else "not a regular file"
            )
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
        try:
            raw = path.read_bytes()
        except OSError as exc:
            pytest.fail(f"cannot read the snapshot {shown}: {exc.strerror or exc}", pytrace=False)
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

        try:
            if path.is_file() and path.read_bytes() == text.encode("utf-8"):
                self._request.node.user_properties.append((_PROPERTY, "unchanged"))
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)  # one file per test, renamed into place: safe under pytest-xdist
        except OSError as exc:  # a read-only folder, a file where a folder must be
            where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
            pytest.fail(f"cannot write the snapshot {shown}: {exc.strerror or exc}{where}", pytrace=False)
        self._request.node.user_properties.append((_PROPERTY, f"wrote {shown}"))


@pytest.fixture
def hook_order(request: pytest.FixtureRequest) -> HookOrder:
    """`with hook_order(model): ...` traces the block and compares its hook order with the test's
    snapshot `__hooktrace__/<test file stem>/<test name>.txt` (`pytest --hooktrace-update` writes it)."""
    return HookOrder(request)


class _Summary:
    """Counts the snapshots written under --hooktrace-update (from every xdist worker's reports), and
    finds the stale ones: files in the snapshot folders of the test files collected that belong to
    no collected test (a renamed or deleted test), or a later block's `.N` file that a passing test
    no longer reached. Stale files are listed; `--hooktrace-remove-stale` removes them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.written: list[str] = []
        self.unchanged = 0
        self.collected: dict[Path, set[str]] = {}  # snapshot folder -> the names of its tests
        self.used: set[str] = set()
        self.passed_names: set[tuple[Path, str]] = set()

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: a deselected test's snapshot is not stale
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            path = Path(str(getattr(item, "path", "")))
            folder = path.parent / SNAPSHOTS / path.stem
            self.collected.setdefault(folder, set()).add(snapshot_name(item.nodeid))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == _PROPERTY:
                if value == "unchanged":
                    self.unchanged += 1
                else:
                    self.written.append(str(value)[len("wrote ") :])
            elif key == _USED:
                self.used.add(str(value))
                if report.passed:
                    self.passed_names.add((Path(str(value)).parent, _test_of(Path(str(value)))))

    def stale(self) -> list[Path]:
        out = []
        for folder, names in self.collected.items():
            if not folder.is_dir():
                continue
            for file in sorted(folder.glob("*.txt")):
                test = _test_of(file)
                if test not in names or (
                    (folder, test) in self.passed_names and str(file) not in self.used and file.stem != test
                ):
                    out.append(file)
        return out

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written or self.unchanged:
            terminalreporter.write_line(
                f"hooktrace: {len(self.written)} snapshot(s) written, {self.unchanged} unchanged"
            )
            for shown in sorted(self.written):
                terminalreporter.write_line(f"  {shown}")
        if not self.collected:  # the pytest-xdist controller collects nothing itself
            if self.config.getoption(REMOVE_STALE):
                terminalreporter.write_line(
                    f"hooktrace: {REMOVE_STALE} needs a run without -n (pytest-xdist)"
                )
            return
        stale = self.stale()
        remove = bool(self.config.getoption(REMOVE_STALE))
        if not stale:
            return
        root = self.config.rootpath
        verb = "removed" if remove else "stale (of no collected test)"
        terminalreporter.write_line(f"hooktrace: {len(stale)} snapshot(s) {verb}:")
        for file in stale:
            if remove:
                file.unlink()
            try:
                shown = str(file.relative_to(root))
            except ValueError:
                shown = str(file)
            terminalreporter.write_line(f"  {shown}")
        if not remove:
            terminalreporter.write_line(f"  (pytest {REMOVE_STALE} removes them)")


def _test_of(file: Path) -> str:
    """The test name a snapshot file belongs to: its stem without a later block's `.N`."""
    return re.sub(r"\.[0-9]+$", "", file.stem)


def pytest_ignore_collect(collection_path: Path) -> Optional[bool]:
    """Snapshot folders hold no tests: pytest's doctest plugin would read `test*.txt` in them as
    doctest files (a snapshot that is not UTF-8 was a collection error before any test ran)."""
    return True if collection_path.name == SNAPSHOTS else None


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(UPDATE, default=False) or config.getoption(REMOVE_STALE, default=False):
        config.pluginmanager.register(_Summary(config), "hooktrace-snapshot-summary")
