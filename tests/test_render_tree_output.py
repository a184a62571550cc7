"""The tree's surprises panel and levels, summary line, layout at a given width, empty traces,
colour, purity and speed (hand-built traces from test_render_tree)."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace
from typing import Any

from hooktrace.render.tree import tree_text
from hooktrace.schema import Surprise, Trace
from hooktrace.validate import load
from tests.test_render_tree import TraceBuilder, encoder, lines_with, plain, two_layer

# -- steps ---------------------------------------------------------------------------------------


def lazy_init_steps() -> Trace:
    """Step 0 runs an extra lazy-init hook (as FSDP does); steps 1-3 have the same order."""
    b = TraceBuilder((("", "Net"), ("fc", "Linear")))
    lazy = b.hook("forward_pre", "", "lazy_init")
    pre = b.hook("forward_pre", "fc", "unshard")
    for step in range(4):
        b.step = step
        b.call("", pre=(lazy,) if step == 0 else (), inner=lambda: b.call("fc", pre=(pre,)))
    return b.trace()


def test_steps_show_a_level_and_collapse_same_order(golden: Any) -> None:
    text = plain(lazy_init_steps())
    golden("tree/steps.txt", text)
    assert "step 0" in text and "step 1" in text
    assert "×2 more steps with the same order (step 2 … step 3)" in text
    assert "4 steps" in text
    assert len(lines_with(plain(lazy_init_steps(), expand=True), "step ")) == 4


def test_one_step_has_no_step_level() -> None:
    assert "step " not in plain(two_layer().trace())


# -- surprises, summary, empty, colour ---------------------------------------------------------------


def test_surprises_panel_and_summary() -> None:
    b = two_layer()
    b.surprises.append(Surprise("global-first", "`early` on `fc1` still ran after global hooks", [2], [3, 4]))
    b.surprises.append(Surprise("replaced-value", "`grad_fc1` returned a value", [6], [17]))
    text = plain(b.trace())
    assert "2 surprises" in text
    assert "global-first: `early` on `fc1` still ran after global hooks" in text
    assert "replaced-value" in text
    assert text.strip().splitlines()[-1] == (
        "7 hooks registered, 7 fired, 10 hook calls, 4 module calls, 4 modules, 2 surprises"
    )
    forward_only = plain(b.trace(), phase="forward")
    assert "global-first" in forward_only and "replaced-value" not in forward_only


def test_surprises_that_differ_only_in_layer_numbers_are_grouped() -> None:
    b = encoder(12)
    for i in range(12):
        msg = f"`pre` on `layers.{i}.self_attn.out_proj` never fired: its module was never called (see #{i})"
        b.surprises.append(Surprise("never-fired", msg, [i], []))
    b.surprises.append(Surprise("never-fired", "`pre` on `layers` never fired", [99], []))
    text = plain(b.trace())
    assert "13 surprises" in text
    assert "layers.0.self_attn.out_proj" in text and "layers.1.self_attn.out_proj" not in text
    assert "×11 more like this for other numbered modules" in text
    assert "`pre` on `layers` never fired" in text
    expanded = plain(b.trace(), expand=True)
    assert "layers.11.self_attn.out_proj" in expanded and "more like this" not in expanded


def test_summary_has_total_time_only_with_times() -> None:
    trace = two_layer().trace()
    assert plain(trace, times=True).strip().endswith("17.5µs total")  # meta.warmup unknown: no claim
    assert "total" not in plain(trace)
    first = " ".join(plain(two_layer().trace(warmup=0), times=True).split())
    assert first.endswith(
        "17.5µs total (step 0's times include first-call work; run a step untraced first: "
        "--warmup 1, or --start 1 with exec)"
    )
    warm = " ".join(plain(two_layer().trace(warmup=3), times=True).split())
    assert warm.endswith("17.5µs total (after 3 warm-up steps, untraced)")
    assert "first-call" not in warm
    assert "4.0µs" in lines_with(plain(trace, times=True), "fc1 Linear")[0]


def test_empty_trace_is_one_clear_line() -> None:
    text = plain(Trace())
    assert text.strip().count("\n") == 0 and text.startswith("No events in this trace")


def test_calls_but_no_hooks() -> None:
    b = TraceBuilder((("", "Net"),))
    b.call("")
    assert plain(b.trace()).startswith("No hooks fired (1 module call traced")


def test_color_only_when_asked() -> None:
    trace = two_layer().trace()
    assert "\x1b[" in tree_text(trace, color=True)
    assert "\x1b[" not in tree_text(trace)
    assert "prepend" in tree_text(trace, color=True)


def test_pure_and_same_after_save_and_load(tmp_path: Any) -> None:
    trace = encoder(3, steps=2).trace()
    first = plain(trace)
    assert plain(trace) == first
    trace.save(tmp_path / "t.json")
    assert plain(load(tmp_path / "t.json")) == first


def test_unsorted_events_are_read_in_seq_order() -> None:
    trace = two_layer().trace()
    trace.events = list(reversed(trace.events))
    assert plain(trace) == plain(two_layer().trace())


def test_large_trace_renders_collapsed_in_linear_time() -> None:
    trace = encoder(12, steps=240).trace()  # about 200k events
    assert len(trace.events) > 200_000
    start = time.perf_counter()
    text = plain(trace)
    elapsed = time.perf_counter() - start
    assert len(text.splitlines()) < 100
    assert "×239 more steps with the same order" in text
    assert elapsed < 60, elapsed


# -- surprise levels, width ----------------------------------------------------------------------


def leveled(rule: str, level: str, message: str, events: list[int]) -> Any:
    """A surprise with a `level` (docs/format.md), whatever the schema's Surprise class holds yet."""
    return SimpleNamespace(rule=rule, level=level, message=message, hooks=[], events=events)


def with_levels() -> Trace:
    trace = two_layer().trace(target="model.py:make")
    trace.surprises = [
        leveled("global-first", "warn", "`early` still ran after global hooks", [3]),
        *(leveled("never-fired", "info", f"library hook {i} never fired", []) for i in range(12)),
    ]
    return trace


def test_every_warn_is_shown_and_info_ones_are_one_line() -> None:
    text = plain(with_levels())
    assert "global-first: `early` still ran after global hooks" in text
    assert "never fired" not in text
    assert "+12 info surprises; --all-surprises shows them" in text
    assert "1 surprise (+12 info)" in text.splitlines()[-1]
    everything = plain(with_levels(), all_surprises=True)
    assert "library hook 0 never fired" in everything and "--all-surprises" not in everything
    assert "13 surprises" in everything


def test_only_info_surprises_give_one_line_and_no_panel() -> None:
    trace = with_levels()
    trace.surprises = trace.surprises[1:]
    text = plain(trace)
    assert "╭" not in text and "+12 info surprises" in text


def test_surprises_without_a_level_are_warnings() -> None:
    b = two_layer()
    b.surprises.append(Surprise("global-first", "old trace", [2], [3]))
    assert "global-first: old trace" in plain(b.trace())


def test_every_line_fits_in_80_columns() -> None:
    for trace in (two_layer().trace(target="model.py:make"), encoder(3, steps=2).trace(), with_levels()):
        for times in (True, False):
            text = tree_text(trace, width=80, times=times)
            assert max(len(line) for line in text.splitlines()) <= 80
    summary = tree_text(two_layer().trace(), width=80, times=True).split("╯")[-1]
    assert re.search(r"\d\S*s total", summary), "the time and 'total' stay together"


def test_defined_at_is_the_file_name_in_the_factory_file_only() -> None:
    b = two_layer()
    b.hooks[0].defined_at = "samples/zoo/model.py:10"
    b.hooks[1].defined_at = "other/lib.py:3"
    text = plain(b.trace(target="samples/zoo/model.py:make"))
    assert "  model.py:10" in text and "samples/zoo/model.py:10" not in text
    assert "other/lib.py:3" in text
    assert "samples/zoo/model.py:10" in plain(b.trace(target="elsewhere.py:make"))


def test_step_0_times_are_marked_as_first_call_work_only_when_the_trace_says_so() -> None:
    trace = encoder(1, steps=2, odd_layer=0).trace(warmup=0)
    text = tree_text(trace, width=100, times=True)
    assert "step 0  (times include first-call work)" in text
    assert "step 1  (" not in text
    assert "first-call" not in plain(trace)  # no times shown: nothing to say about them
    for warmup in (None, 1):  # not known (the Python API), or after a warm-up step
        text = tree_text(encoder(1, steps=2, odd_layer=0).trace(warmup=warmup), width=100, times=True)
        assert "first-call" not in text and "step 0  (" not in text
