"""Chrome Trace Event Format renderer: golden files of hand-built traces, and the fields Perfetto
and chrome://tracing read (X spans in µs, module calls enclosing their hooks, thread names)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from hooktrace.render.chrome import chrome_events, chrome_json, chrome_trace
from hooktrace.validate import load
from tests.test_renderers_all import SAMPLES, Builder, recompute_two_steps, two_layer, with_errors

GOLDEN = {"two_layer": two_layer, "with_errors": with_errors, "recompute_two_steps": recompute_two_steps}


def spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_chrome(name: str, golden: Callable[[str, str], None]) -> None:
    golden(f"chrome/{name}.json", chrome_json(GOLDEN[name]()))


def test_document_layout() -> None:
    trace = two_layer()
    doc = json.loads(chrome_json(trace))
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] == "ns"
    assert doc["otherData"]["target"] == "model.py:make" and doc["otherData"]["torch"] == "2.13.0"
    assert doc == chrome_trace(trace)
    for ev in doc["traceEvents"]:
        assert {"name", "ph", "pid", "tid"} <= set(ev)


def test_hook_spans() -> None:
    trace = two_layer()
    by_seq = {e.seq: e for e in trace.events}
    hooks = [e for e in spans(chrome_trace(trace)) if e["args"]["kind"] != "module_call"]
    assert [e["args"]["seq"] for e in hooks] == [e.seq for e in trace.events if e.type == "hook"]
    for ev in hooks:
        src = by_seq[ev["args"]["seq"]]
        h = trace.hook(src.hook)
        assert ev["name"] == h.name
        assert ev["cat"] == src.phase == ev["args"]["phase"]
        assert isinstance(ev["ts"], float) and ev["ts"] == src.start_ns / 1000
        assert isinstance(ev["dur"], float) and ev["dur"] == src.duration_ns / 1000
        assert ev["tid"] == 1 and ev["args"]["thread"] == src.thread and ev["pid"] == 0
        args = ev["args"]
        assert (args["kind"], args["module"], args["step"], args["hook"]) == (src.kind, src.module, 0, h.id)
        assert args["prepend"] is h.prepend and args["global"] is (h.scope == "global")
        assert args["with_kwargs"] is h.with_kwargs and args["always_call"] is h.always_call
        assert args["returned"] is src.returned and args["error"] == src.error
    early = next(e for e in hooks if e["name"] == "early")
    assert early["args"]["prepend"] is True and early["args"]["prepend_source"] == "registration"
    assert next(e for e in hooks if e["name"] == "global_pre")["args"]["global"] is True
    assert next(e for e in hooks if e["name"] == "weight_grad")["args"]["tensor"] == "fc1.weight"


def test_module_calls_enclose_their_hooks() -> None:
    doc = chrome_trace(two_layer())
    calls = [e for e in spans(doc) if e["args"]["kind"] == "module_call"]
    assert [c["name"] for c in calls] == ["<root> (Net)", "fc1 (Linear)", "act (ReLU)", "fc2 (Linear)"]
    for ev in spans(doc):
        if ev["cat"] != "forward" or ev["args"]["kind"] == "module_call":
            continue
        owner = next(c for c in calls if c["args"]["module"] == ev["args"]["module"])
        assert owner["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= owner["ts"] + owner["dur"]
    root = calls[0]
    assert root["ts"] == 1.0 and root["dur"] == 15.0 and root["args"]["exit_seq"] == 15


def test_call_duration_from_exit_when_enter_has_none() -> None:
    b = Builder(("fc", "Linear"))
    b.enter("fc")
    b.fire(b.hook("forward", "fc", "f"), "fc")
    b.exit("fc")
    b.events[0] = b.events[0]._replace(duration_ns=0)
    call = spans(chrome_trace(b.trace()))[0]
    assert call["args"]["kind"] == "module_call" and call["dur"] == 2.0


def test_errors_threads_and_surprises() -> None:
    doc = chrome_trace(with_errors())
    calls = {c["args"]["module"]: c for c in spans(doc) if c["args"]["kind"] == "module_call"}
    assert calls["fc"]["args"]["error"] == "ValueError: bad shape (2, 3)"
    assert calls["fc"]["args"]["stopped_by_pytorch"] is False
    surprise = next(e for e in doc["traceEvents"] if e["ph"] == "i")
    assert surprise["name"] == "surprise: hook-error" and surprise["ts"] == 3.0 and surprise["args"]["hooks"]

    doc2 = chrome_trace(recompute_two_steps())
    names = {e["tid"]: e["args"]["name"] for e in doc2["traceEvents"] if e["name"] == "thread_name"}
    assert names == {1: "thread 1 (7): forward", 2: "thread 2 (8): recompute, backward"}
    assert {e["tid"] for e in spans(doc2) if e["cat"] == "recompute"} == {2}
    assert {e["args"]["thread"] for e in spans(doc2) if e["cat"] == "recompute"} == {8}
    assert {e["args"]["step"] for e in spans(doc2)} == {0, 1}
    process = next(e for e in doc2["traceEvents"] if e["name"] == "process_name")
    assert process["args"]["name"] == "hooktrace model.py:make"


def test_python_thread_idents_become_small_tids() -> None:
    """Perfetto reads tid as 32 bits and merges threads whose ids do not fit; Python idents do not."""
    trace = recompute_two_steps()
    big = {7: 140681441844096, 8: 140681433451264}
    trace.events = [e._replace(thread=big[e.thread]) for e in trace.events]
    doc = chrome_trace(trace)
    by_seq = {e.seq: e for e in trace.events}
    for ev in spans(doc):
        assert ev["tid"] == (1 if by_seq[ev["args"]["seq"]].thread == big[7] else 2)
        assert ev["args"]["thread"] == by_seq[ev["args"]["seq"]].thread
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
    assert names == [f"thread 1 ({big[7]}): forward", f"thread 2 ({big[8]}): recompute, backward"]


def test_rank_is_the_process() -> None:
    trace = two_layer()
    trace.meta.rank, trace.meta.world_size = 3, 4
    doc = chrome_trace(trace)
    assert {e["pid"] for e in doc["traceEvents"]} == {3}
    assert doc["otherData"]["rank"] == 3


def test_saved_and_loaded_trace_gives_the_same_file(tmp_path: Path) -> None:
    for make in SAMPLES.values():
        trace = make()
        trace.save(tmp_path / "t.json")
        assert chrome_json(load(tmp_path / "t.json")) == chrome_json(trace)


def test_training_step_kinds_are_spans_in_their_phase() -> None:
    from tests.test_renderers_all import training_step

    trace = training_step()
    spans = {
        e["args"]["seq"]: e for e in chrome_events(trace) if e.get("ph") == "X" and e["args"].get("hook")
    }
    assert {s["args"]["kind"] for s in spans.values()} == {
        "forward_wrapper", "pack", "unpack", "node", "post_accumulate_grad", "optimizer_step_pre",
        "optimizer_step_post"}  # fmt: skip
    assert [s["cat"] for s in spans.values() if s["args"]["kind"].startswith("optimizer")] == [
        "optimizer"
    ] * 2
    node = next(s for s in spans.values() if s["args"]["kind"] == "node")
    assert node["args"]["tensor"] == "fc.weight" and node["name"] == "AccumulateGrad_hook"
    assert sorted(spans) == [e.seq for e in trace.events if e.type == "hook"]
