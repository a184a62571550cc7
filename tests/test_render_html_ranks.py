"""`hooktrace ranks FILES... -f html -o report.html` (docs/contract.md, Renderings): every rank in one page, a rank
selector, the first divergence marked; names from user code and file names shown as text. The page
is opened in headless Chromium (skipped when absent), also at a 1280-pixel-wide window, where the
panes' labels must stay whole."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import pytest

from hooktrace.cli import main
from tests import browser
from tests.test_render_html import BIDI, HOSTILE_HOOK, HOSTILE_MODULE, embedded, hostile

# a file name that would be markup if a page parsed it (Linux allows it)
HOSTILE_FILE = "<img src=x onerror=window.pwned=3>"


def hostile_ranks(tmp_path: Path, world: int = 2) -> list[Path]:
    """Rank 0 runs `hostile()`; rank 1 the same with its two hooks the other way round (its first
    divergence is the bidi-named hook where rank 0 ran the markup-named one). Files of hostile names."""
    a = hostile()
    b = copy.deepcopy(a)
    x, y = b.events[2], b.events[3]  # enter '', enter M, fire h, fire g, exit M, exit ''
    b.events[2] = y._replace(seq=x.seq, start_ns=x.start_ns)
    b.events[3] = x._replace(seq=y.seq, start_ns=y.start_ns)
    paths = []
    for rank, trace in enumerate((a, b)):
        trace.meta.rank, trace.meta.world_size = rank, world
        path = tmp_path / f"{HOSTILE_FILE}.rank{rank}.json"
        trace.save(path)
        paths.append(path)
    return paths


def test_ranks_html_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = hostile_ranks(tmp_path, world=3)
    out = tmp_path / "report.html"
    assert main(["ranks", *map(str, reversed(files)), "-o", str(out)]) == 1, "ranks diverge: exit 1"
    captured = capsys.readouterr()
    assert "ranks diverge: rank 1 differs from rank 0" in captured.out, "the summary, as without -o"
    assert f"wrote {out}" in captured.err
    data = embedded(out.read_text(encoding="utf-8"))
    assert data["mode"] == "ranks" and data["ranks"]["ranks"] == [0, 1]
    assert data["ranks"]["missing"] == [2], "world size 3, no trace for rank 2"
    assert [v["note"] for v in data["views"]] == [str(f) for f in files], "each rank's file beside it"
    (c,) = data["ranks"]["comparisons"]
    assert not c["agree"] and c["got_seq"] == 2 and c["expected_seq"] == 2
    assert data["views"][0]["marks"] == [2] and data["views"][1]["marks"] == [2]


def test_ranks_html_to_stdout_keeps_it_one_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = hostile_ranks(tmp_path)
    assert main(["ranks", *map(str, files), "-f", "html"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("<!DOCTYPE html>") and "ranks diverge" not in captured.out
    assert "ranks diverge" in captured.err, "the summary goes to stderr"
    assert embedded(captured.out)["mode"] == "ranks"


def test_ranks_of_agreeing_ranks_exit_0_with_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = hostile()
    for rank in (0, 1):
        t = copy.deepcopy(a)
        t.meta.rank, t.meta.world_size = rank, 2
        t.save(tmp_path / f"r.rank{rank}.json")
    files = [str(tmp_path / f"r.rank{r}.json") for r in (0, 1)]
    assert main(["ranks", *files, "-o", str(tmp_path / "r.html")]) == 0
    data = embedded((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert data["ranks"]["comparisons"][0]["agree"] and not any(v["marks"] for v in data["views"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["-f", "svg"], "unknown --format 'svg' for ranks; use text or html"),
        (["-o", "r.svg"], "ranks writes html only (-f html or -o r.html)"),
    ],
)
def test_ranks_refuses_other_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    files = hostile_ranks(tmp_path)
    assert main(["ranks", *map(str, files), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "r.svg").exists()


# -- in a real browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from browser.chromium()


def _viewport(driver: Any, width: int, height: int) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def _ranks_page(tmp_path: Path) -> Path:
    out = tmp_path / "ranks.html"
    assert main(["ranks", *map(str, hostile_ranks(tmp_path, world=3)), "-o", str(out)]) == 1
    return out


def _panes(driver: Any) -> list[tuple[str, list[str]]]:
    """(label, marked rows' text) of each pane shown."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.pane')).map(p => [p.querySelector('.plabel').textContent,"
        " Array.from(p.querySelectorAll('.row.mark')).map(r => r.textContent)])"
    )


def test_ranks_page_selector_and_divergence(driver: Any, tmp_path: Path) -> None:
    _viewport(driver, 1400, 900)
    logs = browser.open_page(driver, _ranks_page(tmp_path))
    assert [x for x in logs if x.get("level") in ("SEVERE", "WARNING")] == []
    buttons = driver.find_elements("css selector", ".ranksel .btn")
    assert [b.text.strip() for b in buttons] == ["0", "1"]
    assert "on" in buttons[1].get_attribute("class"), "the page opens on the first rank that diverges"
    panes = _panes(driver)
    assert [label for label, _ in panes] == ["rank 0", "rank 1"]
    assert len(panes[0][1]) == 1 and HOSTILE_HOOK in panes[0][1][0], "what rank 0 ran at the divergence"
    assert len(panes[1][1]) == 1 and "evil\\u202eexe.txt" in panes[1][1][0], "what rank 1 ran instead"
    assert "No trace for rank 2." in driver.find_element("css selector", "aside").text
    buttons[0].click()
    assert [label for label, _ in _panes(driver)] == ["rank 0"], "rank 0 alone"
    assert "on" in buttons[0].get_attribute("class") and "on" not in buttons[1].get_attribute("class")
    buttons[1].click()
    assert [label for label, _ in _panes(driver)] == ["rank 0", "rank 1"]


def test_ranks_page_shows_names_as_text(driver: Any, tmp_path: Path) -> None:
    _viewport(driver, 1400, 900)
    browser.open_page(driver, _ranks_page(tmp_path))
    driver.find_element("xpath", "//button[starts-with(., 'go to the first divergence')]").click()
    assert driver.execute_script("return window.pwned === undefined")
    assert driver.find_elements("css selector", "img") == []
    assert len(driver.find_elements("css selector", "script")) == 2, "only the page's own two"
    text = driver.find_element("tag name", "body").text
    assert HOSTILE_MODULE in text and HOSTILE_HOOK in text and HOSTILE_FILE in text
    assert "evil\\u202eexe.txt" in text and "\u202e" not in text, "the bidi override shown as an escape"
    details = driver.find_element("css selector", ".details").text
    assert BIDI.replace("\u202e", "\\u202e") in details, "the selected divergent hook's details"


@pytest.mark.parametrize("width, height", [(1280, 800), (1920, 1080)])
def test_pane_labels_stay_whole_side_by_side(driver: Any, tmp_path: Path, width: int, height: int) -> None:
    """Two panes at a laptop's width: each pane's label and file are shown whole (a narrow head
    wraps instead of cutting them), and both panes' timelines start at the same height."""
    _viewport(driver, width, height)
    try:
        browser.open_page(driver, _ranks_page(tmp_path))
        cut = driver.execute_script(
            "return Array.from(document.querySelectorAll('.pane .plabel, .pane .pnote'))"
            ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"
        )
        assert cut == []
        tops = driver.execute_script(
            "return Array.from(document.querySelectorAll('.pane .timeline')).map(t => t.getBoundingClientRect().top)"
        )
        assert len(tops) == 2 and tops[0] == tops[1]
    finally:
        _viewport(driver, 1400, 900)


@pytest.mark.slow
def test_run_nproc_writes_one_page_of_every_rank(driver: Any, tmp_path: Path) -> None:
    """`run samples/rank_divergence.py --nproc 2 -o ranks.html`: a hook registered on rank 1 only."""
    import subprocess
    import sys

    sample = Path(__file__).resolve().parent.parent / "samples" / "rank_divergence.py"
    out = tmp_path / "ranks.html"
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "run", str(sample), "--nproc", "2", "-o", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # the ranks diverge
    data = embedded(out.read_text(encoding="utf-8"))
    assert [v["note"] for v in data["views"]] == [str(tmp_path / f"ranks.rank{r}.json") for r in (0, 1)]
    _viewport(driver, 1280, 800)
    try:
        browser.open_page(driver, out)
        panes = _panes(driver)
        assert [label for label, _ in panes] == ["rank 0", "rank 1"]
        assert len(panes[1][1]) == 1 and "log_activation" in panes[1][1][0], "rank 1's extra hook marked"
    finally:
        _viewport(driver, 1400, 900)
