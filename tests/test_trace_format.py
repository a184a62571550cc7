"""Trace format v1: round trips through save/load (orjson and stdlib), clear errors for anything else."""

from __future__ import annotations

import io
import json
import sys

import pytest

from hooktrace.schema import Event, Hook, Meta, Module, Surprise, Trace, TraceFormatError, load

trace_module = sys.modules["hooktrace.schema"]


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


# -- large traces: chunked writing, sliced reading, gzip -------------------------------------------------


def many(n: int = 40) -> Trace:
    """`sample()` with n events whose strings contain what the sliced reader looks for."""
    t = sample()
    tricky = ['},{"seq":', '"events":[{"seq":', '}],"surprises":', "naïve ✓", "back\\slash", 'q"uote']
    t.events = [
        Event(i, i // 10, "hook", "forward", f"m{i % 3}", 3, "forward_pre", 7, 5 * i, 2, i % 2 == 0, None)
        if i % 4
        else Event(i, i // 10, "exit", "backward", None, None, None, 7, 5 * i, 0, False, tricky[i % 6])
        for i in range(n)
    ]
    return t


@pytest.fixture(params=["orjson", "stdlib"])
def encoder(request, monkeypatch):
    if request.param == "stdlib":
        monkeypatch.setattr(trace_module, "_orjson", None)
    elif trace_module._orjson is None:
        pytest.skip("orjson is not installed")
    return request.param


@pytest.fixture
def small_slices(monkeypatch):
    """Exercise the chunked writer and the sliced reader on small traces."""
    monkeypatch.setattr(trace_module, "SAVE_CHUNK", 3)
    monkeypatch.setattr(trace_module, "LOAD_CHUNK_BYTES", 64)


def test_chunked_save_writes_the_bytes_of_one_document(tmp_path, encoder, small_slices):
    t = many()
    t.save(tmp_path / "t.json")
    raw = (tmp_path / "t.json").read_bytes()
    assert raw == trace_module.dumps(t.to_dict()) + b"\n" == t.to_json()
    out = io.BytesIO()
    t.write_json(out)
    assert out.getvalue() == raw
    data = json.loads(raw)
    assert list(data) == ["format", "version", "meta", "modules", "hooks", "events", "surprises"]
    assert all(list(e) == list(Event._fields) for e in data["events"])


def test_sliced_load_round_trips(tmp_path, encoder, small_slices):
    for n in (0, 1, 2, 40, 200):
        t = many(n)
        t.save(tmp_path / "t.json")
        loaded = load(tmp_path / "t.json")
        assert loaded.to_dict() == t.to_dict()
        assert loaded.events == t.events and all(type(e) is Event for e in loaded.events)
        sliced = trace_module._load_large((tmp_path / "t.json").read_bytes())
        assert (sliced is None) == (n == 0)  # an empty events array is read whole
        assert sliced is None or sliced.to_dict() == t.to_dict()


def test_sliced_load_needs_no_particular_layout(tmp_path, encoder, small_slices):
    """Other writers: keys in another order, spaces, indentation, top-level keys reordered."""
    t = many()
    path = tmp_path / "t.json"
    data = t.to_dict()
    for text in (
        json.dumps(data, sort_keys=True, separators=(",", ":")),
        json.dumps(data),
        json.dumps(data, indent=2),
        json.dumps({k: data[k] for k in reversed(list(data))}, separators=(",", ":")),
    ):
        path.write_text(text)
        assert load(path).to_dict() == data


def test_sliced_load_reports_bad_events_like_the_whole_document(tmp_path, small_slices):
    data = many().to_dict()
    del data["events"][30]["error"]
    path = tmp_path / "t.json"
    path.write_bytes(trace_module.dumps(data))
    with pytest.raises(TraceFormatError, match=r"events\[30\]"):
        load(path)
    path.write_bytes(trace_module.dumps(data)[:-40])  # cut short
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load(path)


def test_gzip_is_opt_in_by_file_name(tmp_path, encoder, small_slices):
    import gzip

    t = many()
    t.save(tmp_path / "t.json.gz")
    raw = (tmp_path / "t.json.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(raw)) == t.to_dict()  # the same SPEC JSON inside
    assert load(tmp_path / "t.json.gz").to_dict() == t.to_dict()
    (tmp_path / "renamed.json").write_bytes(raw)  # read by its content, not its name
    assert load(tmp_path / "renamed.json").to_dict() == t.to_dict()
    t.save(tmp_path / "plain.json")
    assert (tmp_path / "plain.json").read_bytes()[:1] == b"{"


def test_broken_gzip_is_a_format_error(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceFormatError, match="gzip"):
        load(path)


def test_events_given_as_plain_tuples_are_saved(tmp_path):
    t = sample()
    t.events = [tuple(e) for e in t.events]
    t.save(tmp_path / "t.json")
    assert load(tmp_path / "t.json").events == sample().events


# -- kinds table -----------------------------------------------------------------------------------------


def test_kinds_table_covers_spec_v2():
    from hooktrace import kinds

    assert kinds.SCOPES == ("module", "global", "tensor", "node", "optimizer", "saved_tensors")
    assert kinds.PHASES == ("forward", "backward", "recompute", "optimizer", "other")
    assert kinds.kinds_of("tensor") == ("grad", "post_accumulate_grad")
    assert kinds.kinds_of("node") == ("node_pre", "node")
    assert kinds.kinds_of("saved_tensors") == ("pack", "unpack")
    assert set(kinds.kinds_of("optimizer")) == {
        "optimizer_step_pre",
        "optimizer_step_post",
        "optimizer_state_dict_pre",
        "optimizer_state_dict",
        "optimizer_load_state_dict_pre",
        "optimizer_load_state_dict_post",
    }
    assert set(kinds.kinds_of("global")) == set(kinds.MODULE_KINDS) | set(kinds.REGISTRATION_KINDS) | {
        "optimizer_step_pre",
        "optimizer_step_post",
    }
    assert {"forward_wrapper", "comm"} <= set(kinds.kinds_of("module"))
    for k in kinds.TABLE.values():
        assert k.scopes and set(k.scopes) <= set(kinds.SCOPES)
        assert k.phase is kinds.ENCLOSING or k.phase in kinds.PHASES
        assert k.label and kinds.label(k.name) == k.label
    assert kinds.TABLE["forward"].phase is kinds.ENCLOSING and kinds.TABLE["grad"].phase == "backward"
    assert kinds.label("no_such_kind") == "no_such_kind"


# -- atomic writes -----------------------------------------------------------------------------------------


def test_write_atomic_replaces_keeps_mode_and_leaves_no_temp(tmp_path):
    import os

    from hooktrace.io import write_atomic

    path = tmp_path / "out.txt"
    write_atomic(path, "first")
    assert path.read_text() == "first"
    os.chmod(path, 0o640)
    write_atomic(path, b"second")
    assert path.read_bytes() == b"second" and (os.stat(path).st_mode & 0o777) == 0o640
    write_atomic(path, lambda fh: fh.write(b"third"))
    assert path.read_bytes() == b"third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_write_atomic_failure_leaves_the_old_file(tmp_path):
    from hooktrace.io import write_atomic

    path = tmp_path / "out.txt"
    path.write_text("good")

    def failing(fh):
        fh.write(b"partial")
        raise RuntimeError("mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_atomic(path, failing)
    assert path.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "new.txt", failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_write_atomic_under_a_file_size_limit_leaves_the_old_file(tmp_path):
    """RLIMIT_FSIZE: the write fails part-way (EFBIG); the earlier file stays whole."""
    import subprocess
    import textwrap

    path = tmp_path / "out.json"
    path.write_bytes(b"x" * 10_000)
    code = textwrap.dedent(
        f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from hooktrace.io import write_atomic
        try:
            write_atomic({str(path)!r}, b"y" * 100_000)
        except OSError as exc:
            print("failed", exc.errno)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("failed")
    assert path.read_bytes() == b"x" * 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_write_atomic_through_a_symlink_keeps_the_link(tmp_path):
    from hooktrace.io import write_atomic

    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_failed_save_leaves_the_earlier_trace(tmp_path, name):
    """An event that cannot be encoded fails the save mid-way; the earlier file stays as it was."""
    path = tmp_path / name
    sample().save(path)
    before = path.read_bytes()
    broken = many(3000)
    broken.events[2500] = broken.events[2500]._replace(error=object())
    with pytest.raises(TypeError):  # orjson's JSONEncodeError
        broken.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
