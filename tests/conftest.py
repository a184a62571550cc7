"""Shared fixtures: golden files refreshed by `pytest --update-golden`, reviewed in the diff."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable, Iterator

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """`golden(name, text)`: compare `text` with tests/golden/<name>, or rewrite it with --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; run pytest --update-golden and review the diff")
        assert text == path.read_text(encoding="utf-8"), (
            f"output differs from {path} (pytest --update-golden)"
        )

    return check


@pytest.fixture
def gloo_one_rank() -> Iterator[None]:
    """A real one-rank gloo process group on this machine's loopback (FSDP2, DDP on CPU)."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def no_global_hooks() -> Iterator[None]:
    """Global hooks other tests left behind would make torch.compile(m) warn (and fire them twice):
    the test starts without any; they are back after it, and dynamo's caches are reset."""
    import torch._dynamo
    import torch.nn.modules.module as nn_module

    saved = {
        n: dict(d) for n, d in vars(nn_module).items() if n.startswith("_global_") and isinstance(d, dict)
    }
    for name in saved:
        getattr(nn_module, name).clear()
    yield
    for name, entries in saved.items():
        getattr(nn_module, name).update(entries)
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _global_module_hooks_kept_per_test() -> Iterator[None]:
    """A factory or script run in-process by the CLI tests registers global module hooks it never
    removes (as a user's would); later tests start from the global hook state as it was."""
    from .global_hooks import global_module_hooks_kept

    with global_module_hooks_kept():
        yield
