"""The pytest plugin (SPEC §3b), installed with hooktrace (entry point `pytest11`): lock hook order in tests.

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
    from .schema import Trace

SNAPSHOTS = "__hooktrace__"
UPDATE = "--hooktrace-update"
_PROPERTY = "hooktrace snapshot"  # user_properties key: what happened to a snapshot (travels with xdist)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,\[\]-]")
_MAX_NAME = 120


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
    `Class.test`), with parametrize ids kept; characters that are not safe in file names on every
    system become `_`, and then a short hash of the real name keeps two names apart."""
    name = ".".join(nodeid.split("::")[1:]) or nodeid
    safe = _UNSAFE.sub("_", name)
    if safe != name or len(safe) > _MAX_NAME or safe.startswith("."):
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
        from .compare import OrderFormatError, Side, compare_sides, failure_message
        from .render.order import order_text, parse_order

        text = order_text(trace)
        shown = self._shown(path)
        if self._update:
            self._write(path, text, shown)
            return
        if not path.is_file():
            pytest.fail(
                f"no hook-order snapshot {shown} for this test: run pytest {UPDATE} to write it, "
                "then review and commit it",
                pytrace=False,
            )
        expected_text = path.read_text(encoding="utf-8")
        if expected_text == text:
            return
        try:
            expected = Side(parse_order(expected_text), True, shown)
        except OrderFormatError as exc:
            pytest.fail(
                f"the snapshot {shown} is not an order file ({exc}); rewrite it with {UPDATE}", pytrace=False
            )
        observed = Side(trace, False, "this run")
        result = compare_sides(expected, observed)
        if result.equal:
            return  # the same lines, headers or blank lines aside (a hand-edited snapshot)
        pytest.fail(
            f"hook order differs from the snapshot {shown} (pytest {UPDATE} rewrites it)\n\n"
            + failure_message(expected, observed, result),
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

        if path.is_file() and path.read_text(encoding="utf-8") == text:
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


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(UPDATE, default=False):
        config.pluginmanager.register(_Summary(), "hooktrace-snapshot-summary")
