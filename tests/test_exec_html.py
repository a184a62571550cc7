"""`hooktrace exec` with the HTML report (docs/contract.md, Scripts and Renderings), as users run it: a training script with an
optimizer and an LR scheduler traced to `-o r.html`; `exec --nproc 2 -o r.html` (one page of every
rank, the divergence marked); torchrun `-m hooktrace exec -o r.html` (each rank writes its trace,
`hooktrace ranks` makes the page). The page's hook events are compared with the hooks' own record,
and the pages are opened in headless Chromium (skipped when absent)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import hooktrace
from hooktrace.cli import main
from tests import browser
from tests.test_exec import SCRIPTS, _logged, exec_in  # noqa: F401  (exec_in: the fixture)
from tests.test_render_html import embedded


def _page_hooks(view: dict[str, Any]) -> list[str]:
    """The hook names of a page's view, in event order, read from the trace the page holds."""
    doc = view["trace"]
    names = {h["id"]: h["name"] for h in doc["hooks"]}
    cols, tables = doc["events"]["columns"], doc["events"]["tables"]
    return [names[h] for t, h in zip(cols["type"], cols["hook"]) if tables["type"][t] == "hook"]


@pytest.mark.parametrize("how", [["-f", "html"], []], ids=["format", "extension"])
def test_exec_writes_the_report_of_its_window(exec_in: Any, tmp_path: Path, how: list[str]) -> None:  # noqa: F811
    out = tmp_path / "r.html"
    code, stdout, err, log = exec_in("--start", "2", *how, "-o", str(out), "loop.py", "--steps", "5")
    assert code == 0, err
    assert f"wrote {out} (html:" in err and "stopped the script there" in err
    assert "<!DOCTYPE" not in stdout and "finished" not in stdout
    data = embedded(out.read_text(encoding="utf-8"))
    assert data["mode"] == "trace" and data["views"][0]["label"] == "loop.py"
    assert _page_hooks(data["views"][0]) == _logged(log, 2, 2), "the window's hooks, in the order they ran"


def test_exec_html_to_stdout_follows_the_script_s_output(exec_in: Any, tmp_path: Path) -> None:  # noqa: F811
    code, stdout, err, log = exec_in("--start", "1", "-f", "html", "loop.py", "--steps", "3", "--say", "hi")
    assert code == 0, err
    said, page = stdout.split("\n", 1)
    assert said.startswith("hi ") and page.startswith("<!DOCTYPE html>"), "the script's print, then the page"
    assert _page_hooks(embedded(page)["views"][0]) == _logged(log, 1, 1)


# -- as a user runs it: real processes, the page in a browser -------------------------------------------


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from browser.chromium()


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOOKTRACE_TEST_LOG=str(tmp_path / "hooks.log"), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=600
    )


def _rows(driver: Any) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.tree .row')).map(r => r.textContent)"
    )


def test_exec_report_of_a_training_script_in_the_browser(driver: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = _run(["hooktrace", "exec", "-s", "1", "-o", str(out), "loop.py", "--steps", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert _page_hooks(embedded(out.read_text())["views"][0]) == _logged(tmp_path / "hooks.log", 1, 1)
    logs = browser.open_page(driver, out)
    assert [x for x in logs if x.get("level") in ("SEVERE", "WARNING")] == []
    driver.find_element("xpath", "//button[.='expand all']").click()
    rows = _rows(driver)
    assert any("first_pre" in r and "prepend" in r for r in rows), "the prepend seen at registration"
    assert any("global_pre" in r and "global" in r for r in rows)
    driver.execute_script("const t = document.querySelector('.tree'); t.scrollTop = t.scrollHeight")
    from selenium.webdriver.support.ui import WebDriverWait

    # the tree draws the rows in view, on its scroll event: wait for its end (a loaded machine is slow)
    WebDriverWait(driver, 20).until(lambda d: any(r.lstrip("▸▾").startswith("optimizer") for r in _rows(d)))
    rows = _rows(driver)
    assert any(r.lstrip("▸▾").startswith("optimizer") for r in rows), "the optimizer phase"
    assert any("after_step" in r for r in rows), "the optimizer's step hook (under the LR scheduler)"


@pytest.mark.slow
def test_exec_nproc_writes_one_page_of_every_rank(driver: Any, tmp_path: Path) -> None:
    out = tmp_path / "ranks.html"
    done = _run(
        ["hooktrace", "exec", "--nproc", "2", "-s", "1", "-o", str(out), "ddp.py", "--diverge"], tmp_path
    )
    assert done.returncode == 1, done.stderr  # the ranks diverge
    assert "<!DOCTYPE" not in done.stdout and f"wrote {out} (html: 2 ranks)" in done.stderr
    files = [tmp_path / f"ranks.rank{r}.json" for r in (0, 1)]
    assert all(f.exists() for f in files), "the ranks' own traces beside the page"
    data = embedded(out.read_text())
    assert data["mode"] == "ranks" and [v["note"] for v in data["views"]] == [str(f) for f in files]
    for rank, view in enumerate(data["views"]):
        assert _page_hooks(view) == _logged(Path(f"{tmp_path / 'hooks.log'}.rank{rank}"), 1, 1)
    logs = browser.open_page(driver, out)
    assert [x for x in logs if x.get("level") in ("SEVERE", "WARNING")] == []
    marked = driver.execute_script(
        "return Array.from(document.querySelectorAll('.pane')).map(p =>"
        " Array.from(p.querySelectorAll('.row.mark')).map(r => r.textContent))"
    )
    assert len(marked) == 2 and len(marked[1]) == 1 and "rank1_only" in marked[1][0]


@pytest.mark.slow
def test_torchrun_ranks_write_traces_and_ranks_makes_the_page(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "t.html"
    args = ["torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hooktrace", "exec"]
    done = _run([*args, "-s", "1", "-o", str(out), "ddp.py", "--diverge"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "<!DOCTYPE" not in done.stdout, "no rank prints a page of its own trace alone"
    pattern = str(tmp_path / "t.rank*.json")
    assert done.stderr.count(f"every rank in one page: hooktrace ranks {pattern} -o {out}") == 1, (
        "rank 0 says"
    )
    assert not out.exists()
    files = [str(tmp_path / f"t.rank{r}.json") for r in (0, 1)]
    assert [hooktrace.load(f).meta.rank for f in files] == [0, 1]
    capsys.readouterr()
    assert main(["ranks", *files, "-o", str(out)]) == 1
    (c,) = embedded(out.read_text())["ranks"]["comparisons"]
    assert not c["agree"] and "rank1_only" in c["text"]
