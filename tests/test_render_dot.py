"""DOT/SVG renderer: golden DOT of hand-built traces, what the graph says (order, clusters, colours,
collapse), and that Graphviz's own `dot` accepts it (skipped when it is not installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from typing import Callable

import pytest

from hooktrace.render.dot import ERROR, GLOBAL, PREPEND, STOPPED, dot_source, svg
from hooktrace.schema import Surprise, Trace
from tests.test_renderers_all import SAMPLES, Builder, layers, recompute_two_steps, two_layer, with_errors

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz dot is not installed")

GOLDEN = {
    "two_layer": two_layer,
    "with_errors": with_errors,
    "recompute_two_steps": recompute_two_steps,
    "layers12": lambda: layers(12),
    "layers3_two_steps": lambda: layers(3, steps=2),
}


def _ids(dot: str) -> dict[str, str]:
    """DOT node id -> a readable key: e<first seq> for hook nodes, more<n> for collapse notes."""
    out: dict[str, str] = {}
    for node_id, attrs in re.findall(r"^\s*(\w+) \[(.*)\]$", dot, flags=re.M):
        seq = re.search(r'label="[^"#]*#(\d+)', attrs)
        if node_id.startswith("more"):
            out[node_id] = node_id
        elif node_id.startswith("h") and seq:
            out[node_id] = f"e{seq.group(1)}"
    return out


def nodes(dot: str) -> dict[str, str]:
    """e<seq> -> attribute text of hook nodes; more<n> -> collapse notes."""
    ids = _ids(dot)
    return {ids[i]: a for i, a in re.findall(r"^\s*(\w+) \[(.*)\]$", dot, flags=re.M) if i in ids}


def edges(dot: str) -> list[tuple[str, str]]:
    """The firing-order edges (the invisible ones that only order columns left out)."""
    ids = _ids(dot)
    found = re.findall(r"^\s*(\w+) -> (\w+)(?: \[(.*)\])?$", dot, flags=re.M)
    return [(ids.get(a, a), ids.get(b, b)) for a, b, attrs in found if "invis" not in attrs]


def heading(dot: str) -> str:
    """The graph's own label: the title and the legend (an HTML-like table, the last statement)."""
    return re.findall(r"^\s*label=<(.*)>$", dot, flags=re.M)[-1]


def drawing(dot: str) -> str:
    """Everything but the heading."""
    return dot[: dot.rindex("label=<")]


def cluster_labels(dot: str) -> list[str]:
    return re.findall(r'^\s*color=.* label=("[^"]*"|\S+)', dot, flags=re.M)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_dot(name: str, golden: Callable[[str, str], None]) -> None:
    golden(f"dot/{name}.dot", dot_source(GOLDEN[name]()))


def test_hooks_are_nodes_joined_in_firing_order() -> None:
    trace = two_layer()
    dot = dot_source(trace)
    hook_seqs = [e.seq for e in trace.events if e.type == "hook"]
    assert sorted(int(n[1:]) for n in nodes(dot)) == hook_seqs
    assert edges(dot) == [(f"e{a}", f"e{b}") for a, b in zip(hook_seqs, hook_seqs[1:])]


def test_clusters_per_phase_and_module_call() -> None:
    dot = dot_source(two_layer())
    labels = cluster_labels(dot)
    forward = labels.index("forward")
    assert labels[forward : forward + 4] == ["forward", '"<root> (Net)"', '"fc1 (Linear)"', '"act (ReLU)"']
    assert "backward" in labels and '"fc2 (Linear)"' in labels
    assert not any(label.startswith('"step') for label in labels), "one step: no step clusters"
    dot2 = dot_source(recompute_two_steps())
    labels2 = cluster_labels(dot2)
    assert labels2.count('"step 0"') == 1 and labels2.count('"step 1"') == 1
    assert labels2.count("recompute") == 2


def test_prepend_global_and_error_nodes_stand_out() -> None:
    dot = dot_source(two_layer())
    n = nodes(dot)
    assert "\\nearly\\nprepend" in n["e4"] and f'fillcolor="{PREPEND["fillcolor"]}"' in n["e4"]
    assert "\\nglobal_pre\\nglobal" in n["e1"] and f'fillcolor="{GLOBAL["fillcolor"]}"' in n["e1"]
    assert "with_kwargs · always_call" in n["e6"]
    assert "returned" in n["e5"]
    assert "on fc1.weight" in n["e17"]
    assert "surprise: global-first" in n["e3"]
    err = nodes(dot_source(with_errors()))
    assert (
        "error: ValueError: bad shape (2, 3)" in err["e2"]
        and f'fillcolor="{ERROR["fillcolor"]}"' in err["e2"]
    )
    assert f'fillcolor="{ERROR["fillcolor"]}"' not in err["e3"], "the always_call hook that ran is no error"
    assert 'label="fc (Linear)"' in dot_source(with_errors())
    assert 'label="raised: ValueError: bad shape (2, 3)"' in dot_source(with_errors())


def test_checkpoint_stop_is_not_drawn_as_an_error() -> None:
    b = Builder(("block", "Block"))
    h = b.hook("forward_pre", "block", "pre")
    b.enter("block", "recompute")
    b.fire(h, "block", "recompute")
    b.exit("block", "recompute", error="_StopRecomputationError: ")
    dot = dot_source(b.trace())
    assert "stopped by PyTorch: _StopRecomputationError" in dot
    assert STOPPED["color"] in dot and ERROR["color"] not in drawing(dot)


def test_legend_names_what_is_drawn_and_only_that() -> None:
    legend = heading(dot_source(two_layer()))
    for word in ("forward_pre, forward</FONT></TD><TD BORDER=\"0\" ALIGN=\"LEFT\"><FONT POINT-SIZE=\"9\">forward hook",
                 "prepend", "global", "tensor hook", "dashed box"):  # fmt: skip
        assert word in legend
    for word in ("error", "×N more", "forward_wrapper", "stopped", "recompute", "optimizer"):
        assert word not in legend, word
    assert legend.count("forward hook") == 1, "forward and forward_pre share one colour and one entry"
    legend = heading(dot_source(with_errors()))
    assert "error" in legend and "dashed box" not in legend and "global" not in legend
    legend = heading(dot_source(layers(3)))
    assert "×N more" in legend
    legend = heading(dot_source(recompute_two_steps()))
    assert "forward again during backward (checkpoint)" in legend


def test_identical_layers_collapse_and_expand() -> None:
    trace = layers(12)
    dot = dot_source(trace)
    n_hooks = sum(1 for e in trace.events if e.type == "hook")
    assert "×11 more with the same hook order\\nlayers.1 … layers.11" in dot
    assert "×11 more with the same hook order\\nlayers.10 … layers.0" in dot
    assert '"layers.0 (EncoderLayer)"' in dot and '"layers.11 (EncoderLayer)"' in dot
    assert "layers.5" not in dot
    assert len(nodes(dot)) < n_hooks / 5
    chain = [int(a[1:]) for a, _ in edges(dot) if a.startswith("e")]
    assert chain == sorted(chain), "sequence edges still follow the firing order"

    full = dot_source(trace, expand=True)
    assert "more" not in "".join(nodes(full)) and "×" not in drawing(full)
    assert len(nodes(full)) == n_hooks
    assert all(f'"layers.{i} (EncoderLayer)"' in full for i in range(12))


def test_one_identical_sibling_collapses_as_in_the_tree() -> None:
    dot = dot_source(layers(2))
    assert "×1 more with the same hook order\\nlayers.1" in dot  # forward: layers.0 drawn
    assert "×1 more with the same hook order\\nlayers.0" in dot  # backward: layers.1 drawn
    assert dot.count("(EncoderLayer)") == 2


def test_identical_steps_collapse_and_repeated_calls_aggregate() -> None:
    dot = dot_source(layers(2, steps=3))
    assert "×2 more steps with the same hook order\\nsteps 1–2" in dot
    assert '"step 1"' not in dot
    rec = nodes(dot_source(recompute_two_steps()))
    assert "post_accumulate_grad  #14…#15  ×2" in rec["e14"]
    expanded = nodes(dot_source(recompute_two_steps(), expand=True))
    assert "e15" in expanded and "×2" not in expanded["e14"]


def test_empty_trace() -> None:
    assert "no hook fired in this trace" in dot_source(SAMPLES["empty"]())


def test_awkward_names_are_escaped() -> None:
    b = Builder(("fc", "Linear"))
    h = b.hook("forward", "fc", 'we"ird\\name <x>')
    b.enter("fc")
    b.fire(h, "fc")
    b.exit("fc")
    dot = dot_source(b.trace())
    assert 'we\\"ird\\\\name <x>' in dot
    if HAS_DOT:
        root = ET.fromstring(svg(b.trace()))
        texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
        assert 'we"ird\\name <x>' in texts


@needs_dot
@pytest.mark.parametrize("name", [*SAMPLES, "layers12_expanded"])
def test_graphviz_accepts_the_dot(name: str) -> None:
    trace = layers(12) if name == "layers12_expanded" else SAMPLES[name]()
    source = dot_source(trace, expand=name.endswith("expanded"))
    done = subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert "<svg" in done.stdout


@needs_dot
def test_svg_is_xml_naming_hooks_prepend_and_global() -> None:
    trace = two_layer()
    root = ET.fromstring(svg(trace))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for h in trace.hooks:
        assert h.name in texts
    assert "prepend" in texts and "global" in texts


@needs_dot
def test_svg_of_a_big_synthetic_transformer() -> None:
    trace: Trace = layers(12, steps=2, subs=("self_attn", "dropout", "linear1", "linear2", "norm1", "norm2"))
    root = ET.fromstring(svg(trace))
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "×11 more with the same hook order" in texts
    assert "×1 more step with the same hook order" in texts


def test_info_surprises_are_only_a_count() -> None:
    from tests.test_render_tree_output import with_levels

    trace = with_levels()
    trace.surprises.append(trace.surprises[1].__class__(rule="hook-error", level="info", message="m",
                                                         hooks=[], events=[4]))  # fmt: skip
    dot = dot_source(trace)
    title = heading(dot)
    assert "surprises: global-first" in title and "+13 info surprises" in title
    assert "never-fired" not in dot and "hook-error" not in dot
    assert "surprise: global-first" in nodes(dot)["e3"]


def test_title_has_no_absolute_path() -> None:
    trace = two_layer()
    trace.meta.target = "/home/someone/work/model.py:make"
    assert "hooktrace: model.py:make" in dot_source(trace) and "/home" not in dot_source(trace)


def test_phases_are_columns_side_by_side() -> None:
    """Forward and backward start at the same rank (the edge between them does not rank them): they
    stand side by side; a leaf call's few hooks sit in one row."""
    dot = dot_source(two_layer())
    cross = re.findall(r"^\s*(\w+) -> (\w+) \[constraint=false style=dashed\]$", dot, flags=re.M)
    assert len(cross) == 1, "one edge from forward into backward, not constraining ranks"
    ids = _ids(dot)
    same = re.findall(r"\{\s*rank=same\s*([\w\s]+?)\s*\}", dot)
    rows = [[ids.get(x, x) for x in block.split()] for block in same]
    assert ["e1", "e16"] in rows, "the first forward and the first backward hook share the top rank"
    assert ["e3", "e4", "e5", "e6"] in rows, "fc1's four hooks in one row"


def test_one_phase_has_no_columns() -> None:
    b = Builder(("fc", "Linear"))
    h = b.hook("forward", "fc", "only")
    b.enter("fc")
    b.fire(h, "fc")
    b.exit("fc")
    dot = dot_source(b.trace())
    assert "constraint=false" not in dot and "invis" not in dot


def test_surprises_are_explained_in_the_picture() -> None:
    trace = two_layer()
    text = heading(dot_source(trace))
    assert "global-first: early was prepended but global_pre ran first" in text
    quiet = two_layer()
    quiet.surprises = []
    assert "global-first:" not in heading(dot_source(quiet))


def test_alike_surprises_count_once() -> None:
    trace = layers(3)
    trace.surprises = [
        Surprise("replaced-value", f"forward_hook on layers.{i}.linear1 returned a value", [], [])
        for i in range(3)
    ]
    text = heading(dot_source(trace))
    assert text.count("replaced-value:") == 1 and "(×2 more like this)" in text
