"""Issue 35, items 4-5, in headless Chromium: the HTML report's words are the other renderings' (hook
calls), surprise backticks are code, the timeline's phase labels fit their bands and stay left of the
zoom buttons, its axis never reads below zero after a surprise is clicked, and rows are drawn when
the window grows without a scroll."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace.analysis.counts import count
from hooktrace.render import render
from tests import browser
from tests.test_renderers_all import layers


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from browser.chromium()


def checkpointed(steps: int = 3) -> hooktrace.Trace:
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    head = torch.nn.Linear(4, 1)
    for m in (block[0], block[1], head):
        m.register_forward_pre_hook(lambda mod, args: None)
    model = torch.nn.ModuleDict({"block": block, "head": head})
    with hooktrace.trace(model) as t:
        for _ in range(steps):
            head(
                checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
            ).sum().backward()
            t.mark_step()
    return t.trace


def open_report(driver: Any, tmp_path: Path, trace: hooktrace.Trace, size: tuple[int, int]) -> None:
    driver.set_window_size(*size)
    path = tmp_path / "r.html"
    path.write_text(str(render(trace, "html")), encoding="utf-8")
    browser.open_page(driver, path)


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_the_words_and_the_timeline_labels(driver: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    trace = checkpointed()
    open_report(driver, tmp_path, trace, size)
    head = driver.find_element("css selector", ".phead").text
    assert count(trace).phrase() in head and "event" not in head  # the tree's words
    footer = driver.find_element("css selector", "footer, .footer").text
    assert count(trace).phrase() in footer and "events" not in footer
    phases = driver.execute_script(
        "return Array.from(document.querySelectorAll('.row.phase')).map(r => r.textContent)"
    )
    assert phases and all("hook call" in p and "event" not in p for p in phases)
    labels = driver.execute_script("return window.hooktraceReport.panes[0].timeline.labels")
    assert labels, "some band has room for its label"
    labels.sort(key=lambda x: x["x"])
    for a, b in zip(labels, labels[1:]):
        assert a["x"] + a["w"] < b["x"], (a, b)  # never run together
    assert all(x["x"] + x["w"] <= x["right"] for x in labels)  # never under the zoom buttons


def test_a_band_label_stops_where_the_next_band_begins(driver: Any, tmp_path: Path) -> None:
    """A backward band spans its events' durations, so it holds the recompute its unpack hook ran:
    the recompute band begins inside it. Its label must end before the recompute label begins
    (CI drew "backward · step 0" over "recompute" when the unpack began 83 px before the recompute).
    Timings are set here, one event a millisecond, so the overlap happens on every machine."""
    trace = checkpointed()
    events = trace.events
    for i, e in enumerate(events):
        duration = 0
        if e.kind == "unpack" and i + 1 < len(events) and events[i + 1].phase == "recompute":
            last = next(j for j in range(i + 1, len(events)) if events[j].phase != "recompute")
            duration = (last - i) * 1_000_000  # the unpack hook ran the whole recompute
        events[i] = e._replace(start_ns=e.seq * 1_000_000, duration_ns=duration)
    open_report(driver, tmp_path, trace, (1920, 1080))
    driver.execute_script(
        "const t = window.hooktraceReport.panes[0].timeline; if (t.mode !== 'time') { t.toggleMode(); t.draw() }"
    )
    labels = driver.execute_script("return window.hooktraceReport.panes[0].timeline.labels")
    assert any(x["text"].startswith("recompute") for x in labels), labels
    labels.sort(key=lambda x: x["x"])
    for a, b in zip(labels, labels[1:]):
        assert a["x"] + a["w"] < b["x"], (a, b)


def test_surprise_text_shows_names_as_code(driver: Any, tmp_path: Path) -> None:
    open_report(driver, tmp_path, checkpointed(1), (1280, 800))
    message = driver.find_element("css selector", ".surprise .msg")
    assert "`" not in message.text
    codes = [c.text for c in message.find_elements("css selector", "code")]
    assert "block.0" in codes


def test_the_axis_after_clicking_a_surprise_reads_from_zero(driver: Any, tmp_path: Path) -> None:
    open_report(driver, tmp_path, checkpointed(1), (1280, 800))
    driver.execute_script(
        "const t = window.hooktraceReport.panes[0].timeline; if (t.mode !== 'time') t.toggleMode()"
    )
    driver.find_element("css selector", ".surprise").click()
    # a focus on the first events leaves room before the first one: no tick there
    driver.execute_script(
        "const t = window.hooktraceReport.panes[0].timeline; t.focus([0, 1]); t.v0 = t.t0 - (t.v1 - t.v0); t.draw()"
    )
    ticks = driver.execute_script("return window.hooktraceReport.panes[0].timeline.ticks().map(t => t.label)")
    assert ticks and not any(t.startswith("-") for t in ticks), ticks
    assert ticks[0] == "0ns"


def test_rows_are_drawn_when_the_window_grows(driver: Any, tmp_path: Path) -> None:
    open_report(driver, tmp_path, layers(60), (1280, 500))
    next(b for b in driver.find_elements("css selector", "button") if b.text == "expand all").click()

    def drawn() -> int:
        return driver.execute_script("return document.querySelectorAll('.tree .row').length")

    def needed() -> int:
        return driver.execute_script(
            "const p = window.hooktraceReport.panes[0]; return Math.min(p.visible.length, Math.ceil(p.tree.clientHeight / 22))"
        )

    small = drawn()
    driver.set_window_size(1280, 1400)
    time.sleep(0.5)  # no scroll: only the resize may draw the rows
    assert needed() > small - 10, "the tree's box grew"
    assert drawn() >= needed(), (drawn(), needed(), small)
