"""The HTML report (docs/contract.md, Renderings: `html`): one self-contained page, its data, the CLI's ways to it, and the
page itself in a real headless Chromium (skipped when chromium, chromium-driver or selenium are
absent): no console error, the tree collapses and expands, search filters, a surprise click
highlights its events, hostile names stay text, diff and per-rank pages mark their differences,
and a 100,000-event trace loads, scrolls and filters."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from hooktrace.analysis.diff import diff_traces, differing_events
from hooktrace.render import format_for_path, render
from hooktrace.render.html import HOOK, REPEAT, diff_html, ranks_html
from hooktrace.schema import Hook, Surprise, Trace
from tests import browser
from tests.test_renderers_all import Builder, layers, recompute_two_steps, training_step, two_layer
from tests.trace_samples import realistic

HOSTILE_MODULE = "blk</script><script>window.pwned=1</script>"
HOSTILE_HOOK = "<img src=x onerror=window.pwned=2>"
BIDI = "evil\u202eexe.txt"


def hostile() -> Trace:
    """A module path, a hook name and a surprise message that would be markup if parsed as HTML,
    and a bidi override (it would reorder what follows it on screen)."""
    b = Builder((HOSTILE_MODULE, "Evil&Co"))
    h = b.hook("forward_pre", HOSTILE_MODULE, HOSTILE_HOOK, prepend=True, prepend_source="registration")
    g = b.hook("forward", HOSTILE_MODULE, BIDI)
    b.enter("")
    b.enter(HOSTILE_MODULE)
    b.fire(h, HOSTILE_MODULE)
    b.fire(g, HOSTILE_MODULE)
    b.exit(HOSTILE_MODULE)
    b.exit("")
    b.surprises.append(Surprise("replaced-value", f"{HOSTILE_HOOK} said <b>hi</b> \u2028 & bye", [h], [2]))
    return b.trace("<script>alert(1)</script>.py:make")


def embedded(page: str) -> Any:
    """The JSON data of a report page, parsed as the browser parses it."""
    m = re.search(r'<script type="application/json" id="hooktrace-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def moved() -> tuple[Trace, Trace]:
    """two_layer, and the same trace with fc1's two forward pre-hooks the other way round."""
    a = two_layer()
    b = copy.deepcopy(a)
    x, y = b.events[4], b.events[5]
    b.events[4] = y._replace(seq=x.seq, start_ns=x.start_ns)
    b.events[5] = x._replace(seq=y.seq, start_ns=y.start_ns)
    return a, b


# -- the page, without a browser ---------------------------------------------------------------------


def test_page_is_self_contained() -> None:
    page = render(two_layer(), "html")
    assert isinstance(page, str) and page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=|@import|url\(|https?://""", page.split('id="hooktrace-data"')[0])
    script = page.rsplit("<script>", 1)[1]
    assert "http://" not in script and "https://" not in script and "fetch(" not in script
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page
    assert "default-src 'none'" in page, "a CSP forbids any network request"


def test_extension_and_registry() -> None:
    assert format_for_path("report.html", None) == "html"
    assert format_for_path("r.HTM", None) == "html"


def test_data_is_the_trace_and_its_tree() -> None:
    trace = layers(12)
    data = embedded(render(trace, "html"))
    assert data["mode"] == "trace" and len(data["views"]) == 1
    view = data["views"][0]
    assert view["trace"] == json.loads(trace.to_json()), "the trace format itself, version 2"
    rows = view["rows"]
    hook_rows = [rows["first"][i] for i, t in enumerate(rows["type"]) if t == HOOK]
    assert sorted(hook_rows) == [e.seq for e in trace.events if e.type == "hook"], "every hook event, once"
    assert hook_rows == sorted(hook_rows), "rows in seq order, as the terminal tree reads"
    repeats = [i for i, t in enumerate(rows["type"]) if t == REPEAT]
    counts = sorted(rows["extra"][i] for i in repeats)
    assert 11 in counts, "layers.1 … layers.11 collapsed into one expandable row"
    for i in range(len(rows["type"])):  # subtrees nest
        assert i < rows["end"][i] <= len(rows["type"])
        for j in range(i + 1, rows["end"][i]):
            assert rows["depth"][j] > rows["depth"][i] and rows["end"][j] <= rows["end"][i]


def test_hostile_names_cannot_leave_the_json() -> None:
    page = render(hostile(), "html")
    head, data_and_rest = page.split('id="hooktrace-data">', 1)
    data_text = data_and_rest.split("</script>", 1)[0]
    assert "<" not in data_text and ">" not in data_text and "&" not in data_text
    assert "\u2028" not in data_text and "\u2029" not in data_text
    assert "window.pwned" not in head and "<script>alert" not in page.split("<title>")[1].split("</title>")[0]
    data = embedded(page)
    assert data["views"][0]["trace"]["hooks"][0]["name"] == HOSTILE_HOOK, "the name itself, unchanged"


def test_lone_surrogate_name_is_kept_escaped() -> None:
    b = Builder(("fc", "Linear"))
    h = b.hook("forward", "fc", "bad\ud800name")
    b.enter("fc")
    b.fire(h, "fc")
    b.exit("fc")
    data = embedded(render(b.trace(), "html"))
    assert data["views"][0]["trace"]["hooks"][0]["name"] == "bad\ud800name"


def test_differing_events_mark_the_moved_hooks() -> None:
    a, b = moved()
    assert not diff_traces(a, b).equal
    marks_a, marks_b = differing_events(a, b)
    assert marks_a and marks_b
    assert marks_a <= {4, 5} and marks_b <= {4, 5}
    assert differing_events(a, copy.deepcopy(a)) == (set(), set()), "nothing marked when equal"


def test_differing_events_mark_an_added_hook_only() -> None:
    a = two_layer()
    b = copy.deepcopy(a)
    extra = Hook(999, "forward", "module", module="fc2", name="added_later")
    b.hooks.append(extra)
    at = b.events[13]
    events = b.events[:14] + [at._replace(hook=999)] + b.events[14:]
    b.events = [e._replace(seq=i) for i, e in enumerate(events)]
    marks_a, marks_b = differing_events(a, b)
    assert marks_a == set() and marks_b == {14}


def test_diff_page_holds_both_sides_and_the_summary() -> None:
    a, b = moved()
    data = embedded(diff_html(a, b, "a.json", "b.json"))
    assert data["mode"] == "diff" and [v["label"] for v in data["views"]] == ["a.json", "b.json"]
    assert data["diff"]["summary"] == diff_traces(a, b).summary()
    assert data["views"][0]["marks"] and data["views"][1]["marks"]


def ranks_pair() -> dict[int, Trace]:
    """Two ranks; rank 1 runs fc1's forward pre-hooks the other way round."""
    a, b = moved()
    a.meta.rank, a.meta.world_size = 0, 2
    b.meta.rank, b.meta.world_size = 1, 2
    return {0: a, 1: b}


def test_ranks_page_marks_the_first_divergence() -> None:
    data = embedded(ranks_html(ranks_pair()))
    assert data["mode"] == "ranks" and data["ranks"]["ranks"] == [0, 1]
    (c,) = data["ranks"]["comparisons"]
    assert not c["agree"] and "first divergence" in c["text"]
    assert c["got_seq"] in data["views"][1]["marks"] and c["expected_seq"] in data["views"][0]["marks"]


def test_ranks_page_of_agreeing_ranks_marks_nothing() -> None:
    t = two_layer()
    data = embedded(ranks_html({0: t, 1: copy.deepcopy(t)}))
    assert data["ranks"]["comparisons"][0]["agree"] and not any(v["marks"] for v in data["views"])


def test_cli_render_run_and_diff_write_html(tmp_path: Path) -> None:
    from tests.test_cli import invoke

    a, b = moved()
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    code, _, err = invoke("render", str(tmp_path / "a.json"), "-o", str(tmp_path / "r.html"))
    assert code == 0 and "wrote" in err
    assert embedded((tmp_path / "r.html").read_text())["views"][0]["trace"]["hooks"]
    code, out, _ = invoke(
        "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(tmp_path / "d.html")
    )
    assert code == 1 and "hook order differs" in out
    assert embedded((tmp_path / "d.html").read_text())["mode"] == "diff"
    code, out, _ = invoke("diff", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "-f", "html")
    assert code == 0 and embedded(out)["diff"]["equal"]
    code, _, err = invoke("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-f", "svg")
    assert code == 2 and err.startswith("error:")


# -- the page in a real browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from browser.chromium()


def _page(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _errors(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry.get("level") in ("SEVERE", "ERROR", "WARNING")]


def _rows(driver: Any) -> list[str]:
    """The drawn rows' text, read in one go (rows are redrawn as the tree scrolls)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.tree .row')).map(r => r.textContent)"
    )


@pytest.mark.parametrize(
    "make",
    [two_layer, lambda: layers(12), recompute_two_steps, training_step, hostile],
    ids=["two_layer", "layers12", "recompute_two_steps", "training_step", "hostile"],
)
def test_loads_without_console_errors(driver: Any, tmp_path: Path, make: Any) -> None:
    logs = browser.open_page(driver, _page(tmp_path, "r.html", render(make(), "html")))
    assert _errors(logs) == []
    assert driver.find_elements("css selector", ".tree .row"), "the tree is drawn"
    assert driver.find_elements("css selector", ".timeline canvas")


def test_tree_collapses_and_expands(driver: Any, tmp_path: Path) -> None:
    browser.open_page(driver, _page(tmp_path, "r.html", render(layers(12), "html")))
    rows = _rows(driver)
    assert any(r.startswith("▸×11 more with the same order") for r in rows)
    assert not any("layers.5" in r and "call" in r for r in rows), "the repeats start collapsed"
    driver.execute_script(
        "Array.from(document.querySelectorAll('.row.repeat')).find(r => r.textContent.includes('×11 more'))"
        ".querySelector('[data-toggle]').click()"
    )
    driver.execute_script("document.querySelector('.tree').scrollTop = 0")
    expanded = driver.execute_script("return window.hooktraceReport.panes[0].visible.length")
    assert expanded > len(rows)
    # layers.1 is drawn once the repeat row is open
    found = driver.execute_script(
        "const p = window.hooktraceReport.panes[0]; const m = p.m;"
        "return Array.from(p.visible).some(i => m.rowModule(i) === 'layers.1' && m.rows.type[i] === 2)"
    )
    assert found
    # collapse forward: only the phases' rows stay
    driver.execute_script("document.querySelector('.row.phase [data-toggle]').click()")
    after = driver.execute_script("return window.hooktraceReport.panes[0].visible.length")
    assert after < expanded
    assert _rows(driver)[0].startswith("▸forward")


def test_search_filters_the_tree(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.open_page(driver, _page(tmp_path, "r.html", render(two_layer(), "html")))
    driver.find_element("id", "search").send_keys("grad_fc1")
    WebDriverWait(driver, 10).until(
        lambda d: "1 matching hook call" in d.find_element("css selector", ".count").text
    )
    hooks = [r for r in _rows(driver) if r.lstrip("▸▾").startswith("#")]
    assert len(hooks) == 1 and "grad_fc1" in hooks[0]
    # by kind: the select narrows to the forward_pre hooks
    driver.find_element("css selector", "button:not(.btn)").click()  # clear
    driver.execute_script(
        "const s = document.getElementById('kind'); s.value = 'forward_pre'; s.dispatchEvent(new Event('change'))"
    )
    hooks = [r for r in _rows(driver) if r.lstrip("▸▾").startswith("#")]
    assert len(hooks) == 6 and all("forward_pre" in r for r in hooks)
    # by badge
    driver.execute_script(
        "const k = document.getElementById('kind'); k.value = ''; k.dispatchEvent(new Event('change'));"
        "const s = document.getElementById('badge'); s.value = 'prepend'; s.dispatchEvent(new Event('change'))"
    )
    hooks = [r for r in _rows(driver) if r.lstrip("▸▾").startswith("#")]
    assert len(hooks) == 1 and "early" in hooks[0]


def test_surprise_click_highlights_its_events(driver: Any, tmp_path: Path) -> None:
    browser.open_page(driver, _page(tmp_path, "r.html", render(two_layer(), "html")))
    assert not driver.find_elements("css selector", ".row.hl")
    driver.find_element("css selector", ".surprise").click()
    lit = driver.find_elements("css selector", ".row.hl")
    assert [r.text.split()[0] for r in lit] == ["#3"]
    assert driver.execute_script("return Array.from(window.hooktraceReport.panes[0].hl)") == [3]


def test_surprise_in_a_collapsed_repeat_is_revealed(driver: Any, tmp_path: Path) -> None:
    trace = layers(12)
    seq = next(e.seq for e in trace.events if e.type == "hook" and e.module == "layers.7.linear2")
    trace.surprises.append(Surprise("replaced-value", "forward_hook of layers.7.linear2 returned", [], [seq]))
    browser.open_page(driver, _page(tmp_path, "r.html", render(trace, "html")))
    driver.find_element("css selector", ".surprise").click()
    lit = driver.find_elements("css selector", ".row.hl")
    assert [r.text.split()[0] for r in lit] == [f"#{seq}"], (
        "expanded out of its collapsed repeat, scrolled to"
    )


def test_selecting_a_hook_shows_its_details(driver: Any, tmp_path: Path) -> None:
    browser.open_page(driver, _page(tmp_path, "r.html", render(two_layer(), "html")))
    row = next(r for r in driver.find_elements("css selector", ".tree .row") if "global_pre" in r.text)
    row.click()
    details = driver.find_element("css selector", ".details").text
    assert "global_pre" in details and "global" in details and "model.py:10" in details
    assert "fired\n4 times" in details or "4 times" in details


def test_hostile_names_stay_text(driver: Any, tmp_path: Path) -> None:
    logs = browser.open_page(driver, _page(tmp_path, "r.html", render(hostile(), "html")))
    assert _errors(logs) == []
    assert driver.execute_script("return window.pwned === undefined")
    assert driver.find_elements("css selector", "img") == []
    assert len(driver.find_elements("css selector", "script")) == 2, "only the page's own two"
    text = driver.find_element("tag name", "body").text
    assert HOSTILE_MODULE in text and HOSTILE_HOOK in text
    assert "evil\\u202eexe.txt" in text and "\u202e" not in text, "the bidi override shown as an escape"
    driver.find_element("css selector", ".surprise").click()
    assert "<b>hi</b>" in driver.find_element("css selector", ".surprise .msg").text


def test_diff_page_shows_both_sides_with_marks(driver: Any, tmp_path: Path) -> None:
    a, b = moved()
    logs = browser.open_page(driver, _page(tmp_path, "d.html", diff_html(a, b, "a.json", "b.json")))
    assert _errors(logs) == []
    panes = driver.find_elements("css selector", ".pane")
    assert [p.find_element("css selector", ".plabel").text for p in panes] == ["a.json", "b.json"]
    for pane in panes:
        marked = [r.text for r in pane.find_elements("css selector", ".row.mark")]
        assert marked and all(("early" in r or "cast_inputs" in r) for r in marked)
    assert "hook order differs" in driver.find_element("css selector", ".difftext").text


def test_ranks_page_selects_a_rank_and_marks_the_divergence(driver: Any, tmp_path: Path) -> None:
    logs = browser.open_page(driver, _page(tmp_path, "k.html", ranks_html(ranks_pair())))
    assert _errors(logs) == []
    buttons = driver.find_elements("css selector", ".ranksel .btn")
    assert [b.text for b in buttons] == ["0", "1"] and "diverged" in buttons[1].get_attribute("class")
    assert "1 rank diverges" in driver.find_element("css selector", ".banner").text
    buttons[1].click()
    panes = driver.find_elements("css selector", ".pane")
    assert [p.find_element("css selector", ".plabel").text for p in panes] == ["rank 0", "rank 1"]
    marked = [[r.text for r in p.find_elements("css selector", ".row.mark")] for p in panes]
    assert len(marked[0]) == 1 and "early" in marked[0][0], "what rank 0 ran there"
    assert len(marked[1]) == 1 and "cast_inputs" in marked[1][0], "what rank 1 ran instead"
    driver.find_element("xpath", "//button[starts-with(., 'go to the first divergence')]").click()
    assert len(driver.find_elements("css selector", ".row.mark.hl")) == 2


def test_a_100k_event_trace_loads_scrolls_and_filters(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    trace = realistic(100_000)
    logs = browser.open_page(driver, _page(tmp_path, "big.html", render(trace, "html")))
    assert _errors(logs) == []
    drawn = len(driver.find_elements("css selector", ".tree .row"))
    assert 0 < drawn < 200, "only the visible rows are in the page"
    last = max(e.seq for e in trace.events if e.phase == "backward")  # the tree's last row: backward's last
    driver.find_element("xpath", "//button[.='expand all']").click()
    assert driver.execute_script("return window.hooktraceReport.panes[0].visible.length") > 60_000
    driver.execute_script("const t = document.querySelector('.tree'); t.scrollTop = t.scrollHeight")
    WebDriverWait(driver, 30).until(lambda d: any(f"#{last} " in r for r in _rows(d)))
    driver.find_element("id", "search").send_keys("layers.20.sub5")
    WebDriverWait(driver, 30).until(
        lambda d: "matching hook call" in d.find_element("css selector", ".count").text
    )
    count = int(driver.find_element("css selector", ".count").text.split()[0])
    expected = sum(1 for e in trace.events if e.type == "hook" and e.module == "layers.20.sub5")
    assert count == expected > 0


def test_no_hidden_or_reordering_character_raw_in_the_page() -> None:
    from hooktrace.render.safe import UNSAFE_CHARS

    page = render(hostile(), "html")
    assert not re.search(f"[{UNSAFE_CHARS.replace(chr(10), '').replace(chr(9), '')}]", page.replace("\n", ""))
    assert embedded(page)["views"][0]["trace"]["hooks"][1]["name"] == BIDI, "the same string once parsed"
