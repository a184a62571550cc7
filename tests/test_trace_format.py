"""Trace format v1: round trips through save/load (orjson and stdlib), clear errors for anything else."""

from __future__ import annotations

import json
import sys

import pytest

from hooktrace.trace import Event, Hook, Meta, Module, Surprise, Trace, TraceFormatError, load

trace_module = sys.modules["hooktrace.trace"]


def sample() -> Trace:
    hooks = [
        Hook(
            id=3,
            kind="forward_pre",
            scope="module",
            module="fc",
            name="f",
            prepend=True,
            prepend_source="registration",
        )
    ]
    events = [
        Event(0, 0, "enter", "forward", "fc", None, None, 7, 0, 50, False, None),
        Event(1, 0, "hook", "forward", "fc", 3, "forward_pre", 7, 5, 2, True, None),
        Event(2, 0, "exit", "forward", "fc", None, None, 7, 50, 0, False, "ValueError: x"),
    ]
    return Trace(
        Meta(torch="2.13.0", python="3.11", steps=1, created="2026-12-02T00:00:00+00:00"),
        [Module("", "Sequential"), Module("fc", "Linear")],
        hooks,
        events,
        [Surprise("replaced-value", "m", [3], [1])],
    )


@pytest.mark.parametrize("encoder", ["orjson", "stdlib"])
def test_round_trip(tmp_path, monkeypatch, encoder):
    if encoder == "stdlib":
        monkeypatch.setattr(trace_module, "_orjson", None)
    elif trace_module._orjson is None:
        pytest.skip("orjson is not installed")
    original = sample()
    path = tmp_path / "t.json"
    original.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "hooktrace.trace" and data["version"] == 1
    assert list(data["events"][0]) == list(Event._fields)
    loaded = load(path)
    assert loaded.to_dict() == original.to_dict()
    assert loaded.events[1].hook == 3 and loaded.hook(3).prepend_source == "registration"


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[]", "top level must be a JSON object"),
        ('{"format": "other"}', "not a hooktrace trace"),
        ('{"format": "hooktrace.trace", "version": 2}', "unsupported trace version 2"),
        ('{"format": "hooktrace.trace", "version": 1, "meta": {}}', "missing the 'modules' field"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=message):
        load(path)


def test_malformed_event_is_named(tmp_path):
    data = sample().to_dict()
    del data["events"][2]["error"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match=r"events\[2\]"):
        load(path)
    data = sample().to_dict()
    data["hooks"][0]["bogus"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match=r"hooks\[0\] has unknown field\(s\): bogus"):
        load(path)


def test_binary_file_is_a_format_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceFormatError):
        load(path)
