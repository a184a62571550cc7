"""Trace format (docs/format.md): version 2 written, versions 1 and 2 read, every field checked on load.
(gzip, atomic writes and the kinds table: test_trace_files.py.)"""

from __future__ import annotations

import copy
import gzip
import io
import json
from pathlib import Path

import pytest

from hooktrace.schema import Event, Trace, TraceFormatError
from hooktrace.validate import load
from tests.trace_samples import realistic, sample, v1_dict, write

DATA = Path(__file__).parent / "data"


# -- version 2 written ---------------------------------------------------------------------------------------


def test_round_trip_writes_version_2_columns(tmp_path):
    original = sample()
    path = tmp_path / "t.json"
    original.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "hooktrace.trace" and data["version"] == 2
    events = data["events"]
    # every field but `shapes`: traced without --shapes
    assert events["count"] == 4 and list(events["columns"]) == list(Event._fields[:-2])
    assert all(len(c) == 4 for c in events["columns"].values())
    tables = events["tables"]
    for name in ("type", "phase", "kind", "module", "thread"):
        values = [tables[name][i] if i is not None else None for i in events["columns"][name]]
        assert values == [getattr(e, name) for e in original.events]
    assert events["columns"]["hook"] == [None, 3, None, 9] and events["columns"]["seq"] == [0, 1, 2, 3]
    assert data["surprises"][1] == {
        "rule": "never-fired",
        "level": "info",
        "message": "n",
        "hooks": [9],
        "events": [],
    }
    loaded = load(path)
    assert loaded.to_dict() == original.to_dict() == data
    assert loaded.events == original.events and all(type(e) is Event for e in loaded.events)
    assert loaded.hook(3).prepend_source == "registration" and loaded.surprises[1].level == "info"
    assert path.read_bytes() == original.to_json()
    out = io.BytesIO()
    original.write_json(out)
    assert out.getvalue() == path.read_bytes()


def test_version_2_as_the_spec_writes_it_without_a_thread_table(tmp_path):
    """A writer that follows docs/format.md to the letter (raw thread idents, four tables) is read too."""
    original = sample()
    data = original.to_dict()
    data["events"]["columns"]["thread"] = [e.thread for e in original.events]
    del data["events"]["tables"]["thread"]
    assert load(write(tmp_path / "t.json", data)).events == original.events


def test_empty_trace_and_plain_tuples_round_trip(tmp_path):
    Trace().save(tmp_path / "e.json")
    assert load(tmp_path / "e.json").to_dict() == Trace().to_dict()
    t = sample()
    t.events = [tuple(e) for e in t.events]
    t.save(tmp_path / "t.json")
    assert load(tmp_path / "t.json").events == sample().events


def test_events_with_the_wrong_number_of_values_are_not_saved(tmp_path):
    t = sample()
    t.events[2] = tuple(t.events[2])[:11]
    with pytest.raises(TraceFormatError, match=r"events\[2\] has 11 values"):
        t.save(tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_bytes_per_event_of_version_2(tmp_path):
    """Issue 17: at most 60 B per event on disk (version 1 took 189-207)."""
    n = 200_000
    path = tmp_path / "big.json"
    realistic(n).save(path)
    assert path.stat().st_size / n <= 60
    assert len(load(path).events) == n


# -- versions 1 and 2 read -------------------------------------------------------------------------------


def test_version_1_documents_load_as_before(tmp_path):
    original = sample()
    original.surprises[1].level = "warn"
    loaded = load(write(tmp_path / "v1.json", v1_dict(original)))
    assert loaded.to_dict() == original.to_dict()
    assert [s.level for s in loaded.surprises] == ["warn", "warn"]  # version 1 has no level: "warn"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("v1_*.json*")))
def test_version_1_files_written_by_hooktrace_before_version_2(tmp_path, name):
    """Files saved by the version 1 writer (runs of the samples): the same events, hooks and
    renderings as their version 2 re-save."""
    from hooktrace.render import render

    raw = (DATA / name).read_bytes()
    data = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
    assert data["version"] == 1
    trace = load(DATA / name)
    assert trace.events == [Event(**e) for e in data["events"]]  # decoded independently here
    assert [h.__dict__ for h in trace.hooks] == data["hooks"]
    trace.save(tmp_path / "v2.json")
    again = load(tmp_path / "v2.json")
    assert again.to_dict() == trace.to_dict()
    assert render(again, "tree") == render(trace, "tree") and render(again, "dot") == render(trace, "dot")


# -- anything else refused, in one line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[]", "top level must be a JSON object"),
        ('{"format": "other"}', "not a hooktrace trace"),
        ('{"format": "hooktrace.trace", "version": 4}', "unsupported trace version 4"),
        ('{"format": "hooktrace.trace", "version": true}', "unsupported trace version True"),
        ('{"format": "hooktrace.trace", "version": 1, "meta": {}}', "missing the 'modules' field"),
        (
            '{"traceEvents": [], "displayTimeUnit": "ns"}',
            r"this is a Chrome trace \(for Perfetto\), not a hooktrace",
        ),
        ('[{"ph": "X", "name": "a", "ts": 0}]', "this is a Chrome trace"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=message):
        load(path)


def test_binary_file_is_a_format_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceFormatError):
        load(path)


def test_a_chrome_trace_written_by_hooktrace_is_named_as_such(tmp_path):
    from hooktrace.render import render

    path = tmp_path / "c.json"
    path.write_text(render(sample(), "chrome"))
    with pytest.raises(TraceFormatError, match="Chrome trace"):
        load(path)


def test_echoed_values_are_cut_short(tmp_path):
    path = write(tmp_path / "t.json", {"format": "x" * 1_000_000})
    with pytest.raises(TraceFormatError) as info:
        load(path)
    assert len(str(info.value)) < 200
    data = sample().to_dict()
    data["hooks"][0]["y" * 100_000] = 1
    data["hooks"][1]["name"] = ["z" * 100_000]
    with pytest.raises(TraceFormatError) as info:
        load(write(tmp_path / "t.json", data))
    assert len(str(info.value)) < 200


# Wrong values for every field of every record: (where, field, wrong value).
_BAD = {
    "meta": [
        ("torch", 2),
        ("python", None),
        ("device", []),
        ("target", 3),
        ("steps", "1"),
        ("steps", True),
        ("created", 0),
        ("rank", "0"),
        ("world_size", 1.5),
        ("clock_perf_ns", "1"),
        ("clock_unix_ns", 1.5),
    ],
    "modules": [("path", None), ("path", 1), ("type", {})],
    "hooks": [
        ("id", "3"),
        ("id", None),
        ("id", 3.0),
        ("id", True),
        ("kind", "forward_prehook"),
        ("kind", 1),
        ("scope", "modul"),
        ("module", 5),
        ("tensor", []),
        ("name", None),
        ("defined_at", 7),
        ("registered_at", {}),
        ("registered_by", False),
        ("prepend", 1),
        ("prepend", "true"),
        ("prepend_source", "guessed"),
        ("with_kwargs", None),
        ("always_call", 0),
        ("registered_during_run", "no"),
        ("removed_during_run", []),
    ],
    "surprises": [
        ("rule", 1),
        ("message", None),
        ("hooks", [3.5]),
        ("hooks", "3"),
        ("hooks", [True]),
        ("events", None),
        ("level", "error"),
        ("level", None),
    ],
}
_BAD_EVENTS = [
    ("seq", "0"),
    ("seq", None),
    ("seq", 1.0),
    ("step", None),
    ("step", True),
    ("type", "call"),
    ("type", None),
    ("type", 0),
    ("phase", "fwd"),
    ("phase", None),
    ("module", 1),
    ("module", []),
    ("hook", "3"),
    ("hook", 3.0),
    ("kind", "forward_prehook"),
    ("kind", 7),
    ("thread", None),
    ("thread", "7"),
    ("start_ns", None),
    ("start_ns", 0.5),
    ("duration_ns", "2"),
    ("returned", 0),
    ("returned", None),
    ("error", 1),
    ("error", {"a": 1}),
]


def _cases():
    for where, bad in _BAD.items():
        for name, value in bad:
            yield pytest.param(where, name, value, id=f"{where}.{name}={value!r}")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("where, name, value", list(_cases()))
def test_a_field_of_the_wrong_type_is_refused(tmp_path, version, where, name, value):
    data = sample().to_dict() if version == 2 else v1_dict(sample())
    record = data[where] if where == "meta" else data[where][1 if where != "modules" else 0]
    record[name] = value
    with pytest.raises(TraceFormatError, match=name):
        load(write(tmp_path / "t.json", data))


@pytest.mark.parametrize("name, value", _BAD_EVENTS, ids=[f"{n}={v!r}" for n, v in _BAD_EVENTS])
def test_an_event_field_of_the_wrong_type_is_refused_in_version_1(tmp_path, name, value):
    data = v1_dict(sample())
    data["events"][1][name] = value
    with pytest.raises(TraceFormatError, match="seq|" + name):
        load(write(tmp_path / "t.json", data))


@pytest.mark.parametrize("name, value", _BAD_EVENTS, ids=[f"{n}={v!r}" for n, v in _BAD_EVENTS])
def test_an_event_field_of_the_wrong_type_is_refused_in_version_2(tmp_path, name, value):
    """In a plain column the value itself; in an indexed column both the value in the table and the
    index in the column."""
    data = sample().to_dict()
    events = data["events"]
    if name in events["tables"]:
        variant = copy.deepcopy(data)
        if value is not None:
            variant["events"]["tables"][name][0] = value
            with pytest.raises(TraceFormatError, match=name):
                load(write(tmp_path / "t.json", variant))
        events["columns"][name][1] = value if value is None or not isinstance(value, int) else 99
    else:
        events["columns"][name][1] = value
    with pytest.raises(TraceFormatError, match="seq|" + name):
        load(write(tmp_path / "t.json", data))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ev: ev["columns"]["module"].__setitem__(0, -1), "index -1"),
        (lambda ev: ev["columns"]["type"].__setitem__(0, True), "True"),
        (lambda ev: ev["columns"]["kind"].__setitem__(1, 5), "index 5"),
        (lambda ev: ev["columns"]["seq"].pop(), '"seq" must be a list of 4'),
        (lambda ev: ev.__setitem__("count", 5), "must be a list of 5"),
        (lambda ev: ev.__setitem__("count", "4"), "count"),
        (lambda ev: ev["columns"].pop("error"), "must have the columns"),
        (lambda ev: ev["tables"].pop("kind"), "tables"),
        (lambda ev: ev["tables"].__setitem__("type", "hook"), "must be a list"),
        (lambda ev: ev["tables"]["phase"].append("forward"), "repeats"),
        (lambda ev: ev["columns"]["seq"].__setitem__(3, 1), "seq 1 appears more than once"),
        (lambda ev: ev["columns"]["hook"].__setitem__(1, None), "without a hook id"),
        (lambda ev: ev["columns"]["hook"].__setitem__(1, 77), "hook id 77"),
        (lambda ev: ev.__setitem__("columns", []), "must have the columns"),
    ],
)
def test_version_2_layout_errors(tmp_path, change, message):
    data = sample().to_dict()
    change(data["events"])
    with pytest.raises(TraceFormatError, match=message):
        load(write(tmp_path / "t.json", data))


def test_references_and_duplicates_are_refused(tmp_path):
    for change, message in (
        (lambda d: d["events"].__setitem__(3, {**d["events"][3], "seq": 0}), "seq 0 appears more than once"),
        (lambda d: d["hooks"][1].__setitem__("id", 3), "id 3 appears more than once"),
        (lambda d: d["surprises"][0].__setitem__("hooks", [4]), r"surprises\[0\] refers"),
        (lambda d: d["surprises"][0].__setitem__("events", [40]), r"surprises\[0\] refers"),
        (lambda d: d["events"][1].pop("error"), r"events\[1\]: missing error"),
        (lambda d: d["events"][1].__setitem__("bogus", 1), r"events\[1\]: unknown 'bogus'"),
        (lambda d: d["events"].__setitem__(1, [1, 2]), r"events\[1\] must be an object"),
        (lambda d: d["hooks"][0].__setitem__("bogus", 1), r"hooks\[0\] has unknown field\(s\): 'bogus'"),
        (lambda d: d["hooks"][0].pop("kind"), r"hooks\[0\] is missing the field 'kind'"),
        (lambda d: d.__setitem__("modules", {}), "'modules' must be a list"),
    ):
        data = v1_dict(sample())
        change(data)
        with pytest.raises(TraceFormatError, match=message):
            load(write(tmp_path / "t.json", data))


def test_duplicate_keys_load_the_same_small_and_large(tmp_path):
    """A repeated key keeps its last value, whatever the file's size (the sliced reader of version 1
    took the first one in files of 64 KiB and more)."""
    for n in (4, 5000):
        t = realistic(n) if n > 4 else sample()
        text = t.to_json().decode()
        doubled = text.replace('"version":2,', '"version":1,"version":2,').replace(
            '"meta":{', '"meta":{"target":"first",', 1
        )
        doubled = doubled.replace('"target":null', '"target":"last"', 1)
        path = tmp_path / "t.json"
        path.write_text(doubled)
        loaded = load(path)
        assert loaded.meta.target == "last" and loaded.events == t.events
        v1 = json.dumps(v1_dict(t))
        v1 = v1.replace('"seq": 1,', '"seq": 0, "seq": 1,', 1)
        path.write_text(v1)
        assert load(path).events == t.events
