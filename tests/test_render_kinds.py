"""The renderers draw kinds, phases and the root as hooktrace/kinds.py says: every table in render/
keyed by phase or kind covers every one, a kind has its row's colour in the terminal tree, the DOT
picture and its legend, and the HTML page (in a headless Chromium, skipped when absent), and the
page's assets spell no kind, phase or root label (render/html.py sends them with the data)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
from rich.console import Console
from rich.style import Style

from hooktrace import kinds
from hooktrace.kinds import FORWARD, PHASES, RECOMPUTE, ROOT, TABLE, K
from hooktrace.render import badges, dot, html, render, tree
from hooktrace.schema import Trace
from tests import browser
from tests.test_render_dot import heading, nodes
from tests.test_render_html import embedded
from tests.test_renderers_all import Builder

ASSETS = Path(html.__file__).parent / "html_assets"


def every_kind() -> tuple[Trace, dict[str, int]]:
    """One hook of every kind, fired once in its row's phase inside `fc` (one more forward_pre in
    recompute, so that every phase shows), and two packs in a row (one saved-tensors summary);
    the seq of each kind's event."""
    b = Builder(("fc", "Linear"), ("ck", "Linear"))
    b.enter("")
    b.enter("fc")
    seqs = {}
    for k, info in TABLE.items():
        h = b.hook(k, "fc", f"{k}_hook", scope=info.scopes[0])
        seqs[k] = b.fire(h, "fc", info.phase or FORWARD)
    b.exit("fc")
    again = b.hook(K.forward_pre, "ck", "again")
    b.enter("ck", RECOMPUTE)
    b.fire(again, "ck", RECOMPUTE)
    b.exit("ck", RECOMPUTE)
    b.enter("ck")
    pack = b.hook(K.pack, "ck", "to_cpu", scope=TABLE[K.pack].scopes[0])
    b.fire(pack, "ck")
    b.fire(pack, "ck")
    b.exit("ck")
    b.exit("")
    return b.trace(), seqs


STYLED = [k for k, info in TABLE.items() if info.style is not None]
FAMILY = [k for k, info in TABLE.items() if info.family is not None]


# -- every table keyed by phase or kind covers every one ------------------------------------------------


def test_phase_tables_cover_every_phase() -> None:
    assert set(dot.PHASE_FILL) == set(PHASES)
    assert set(dot.COLUMN) == set(PHASES)
    assert set(html.PHASE_BANDS) == set(PHASES)
    assert set(badges.PHASE_TITLES) == set(PHASES)
    assert set(embedded(render(every_kind()[0], "html"))["words"]["phases"]) == set(PHASES)
    # the phases whose name needs explaining have a long title in the tree and the page, and a legend note
    # in the picture (where the short name labels the cluster)
    long = {p for p in PHASES if badges.PHASE_TITLES[p] != p}
    assert long and set(dot.PHASE_NOTES) == long == set(dot.PHASE_SHORT)


def test_every_row_colour_has_its_page_colour() -> None:
    """The page draws a row's terminal colour (Kind.style) in one colour of its own: two kinds look
    alike in the page exactly when they do in the terminal."""
    styles = {info.style for info in TABLE.values()} - {None}
    assert styles <= set(html.STYLE_COLOURS)
    assert len(set(html.STYLE_COLOURS.values())) == len(html.STYLE_COLOURS)
    colours = embedded(render(every_kind()[0], "html"))["words"]["kind_colours"]
    assert set(colours) == set(STYLED)
    for a in STYLED:
        for b in STYLED:
            assert (colours[a] == colours[b]) == (TABLE[a].style == TABLE[b].style), (a, b)


# -- a kind has its row's colour in every rendering ----------------------------------------------------


def test_tree_draws_each_kind_in_its_rows_colour() -> None:
    trace, seqs = every_kind()
    console = Console(width=200, color_system="truecolor", force_terminal=True, highlight=False)
    segments = [s for s in console.render(tree.build_tree(trace)) if s.text.strip()]
    at = {s.text.strip(): i for i, s in enumerate(segments) if re.fullmatch(r"#\d+", s.text.strip())}
    for k in STYLED:
        drawn = segments[at[f"#{seqs[k]}"] + 1]
        assert drawn.text.strip() == k
        assert drawn.style is not None and drawn.style.color == Style.parse(TABLE[k].style).color, k
    (saved,) = [s for s in segments if s.text == "saved tensors"]
    assert saved.style is not None and saved.style.color == Style.parse(TABLE[K.pack].style).color


def test_dot_fills_each_kind_and_its_legend_entry_with_its_familys_colour() -> None:
    trace, seqs = every_kind()
    source = dot.dot_source(trace)
    drawn = nodes(source)
    legend = dict(re.findall(r'BGCOLOR="([^"]+)"[^>]*><FONT POINT-SIZE="9">([^<]*)</FONT>', heading(source)))
    for k in FAMILY:
        words, fill = kinds.FAMILIES[TABLE[k].family]  # type: ignore[index]
        assert f'fillcolor="{fill}"' in drawn[f"e{seqs[k]}"], k
        assert k in legend[fill].split(", "), (k, legend)
        assert words in heading(source)
    _, fill = kinds.FAMILIES[TABLE[K.pack].family]  # type: ignore[index]
    saved = re.search(r'label="saved tensors.*', source)
    assert saved and f'fillcolor="{fill}"' in saved.group()


# -- the HTML page -------------------------------------------------------------------------------------


def _code(text: str) -> str:
    """An asset without its comments (an English `other` or `backward` there is no kind)."""
    return re.sub(r"/\*.*?\*/|(?<![:\"'])//[^\n]*", "", text, flags=re.S)


_SCOPE_OR_TYPE = "|".join(map(re.escape, kinds.SCOPES + kinds.EVENT_TYPES))
_COMPARED = re.compile(rf"""[=!]==?\s*["']({_SCOPE_OR_TYPE})["']|["']({_SCOPE_OR_TYPE})["']\s*[=!]==?""")


def _spelled(text: str) -> list[str]:
    """Kinds, phases and the root label in an asset's code, `k-<kind>` colour classes, and scopes or
    event types it compares with (it compares with the words the data sends)."""
    code = _code(text)
    words = set(re.findall(r"(?<![\w-])\w+(?![\w-])", code))
    found = sorted(words & (set(kinds.KINDS) | set(PHASES)))
    found += [ROOT] if ROOT in code else []
    found += re.findall(r"\bk-\w+", code)
    found += [a or b for a, b in _COMPARED.findall(code)]
    return found


@pytest.mark.parametrize("asset", sorted(p.name for p in ASSETS.iterdir()))
def test_assets_spell_no_kind_phase_or_root(asset: str) -> None:
    assert _spelled((ASSETS / asset).read_text(encoding="utf-8")) == []


def test_asset_check_finds_what_is_spelled() -> None:
    js = 'if (m.kind[e] === "grad" || p === "<root>") x = 1; // the other grad hooks\nif ("hook" !== t) y();'
    assert _spelled(js) == ["grad", ROOT, "hook"]
    assert _spelled(".k-grad { color: red; } /* forward */") == ["k-grad"]
    assert _spelled('span(row, "", plural(n, "hook"));') == []


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from browser.chromium()


def _hex(rgb: str) -> str:
    return "#" + "".join(f"{int(x):02x}" for x in re.findall(r"\d+", rgb)[:3])


def test_page_draws_kinds_phases_and_root_as_kinds_py_says(driver: Any, tmp_path: Path) -> None:
    trace, seqs = every_kind()
    page = tmp_path / "kinds.html"
    page.write_text(render(trace, "html"), encoding="utf-8")
    driver.set_window_size(1400, 2400)  # every row drawn (the tree draws the rows in view)
    logs = browser.open_page(driver, page)
    assert not [x for x in logs if x["level"] == "SEVERE"], logs
    shown = driver.execute_script(
        """const colour = (e) => getComputedStyle(e).color;
           return {
             kinds: Array.from(document.querySelectorAll('.row .kind')).map((k) =>
               [k.parentElement.querySelector('.seq').textContent.trim(), k.textContent.trim(), colour(k)]),
             saved: Array.from(document.querySelectorAll('.row span'))
               .filter((s) => s.textContent === 'saved tensors ').map(colour),
             phases: Array.from(document.querySelectorAll('.row.phase')).map((r) => r.children[1].textContent),
             modules: Array.from(document.querySelectorAll('.row .mod')).map((m) => m.textContent),
           };"""
    )
    text = _hex(driver.execute_script("return getComputedStyle(document.body).color"))
    drawn = {seq: (kind, _hex(c)) for seq, kind, c in shown["kinds"]}
    for k, seq in seqs.items():
        style = TABLE[k].style
        assert drawn[f"#{seq}"] == (k, html.STYLE_COLOURS[style] if style else text), k
    assert [_hex(c) for c in shown["saved"]] == [html.STYLE_COLOURS[TABLE[K.pack].style]]  # type: ignore[index]
    assert set(shown["phases"]) == {badges.PHASE_TITLES[p] for p in PHASES}
    assert ROOT in shown["modules"], "the root module's label"
