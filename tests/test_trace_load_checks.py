"""Loading checks whole columns at C speed (issue 17): the fast checks must say exactly what the
per-value checks say, on every kind of JSON value, in large files as in small ones."""

from __future__ import annotations

import enum
import gc
import gzip
import math

import orjson
import pytest

from hooktrace.io.columns import all_bools, all_ints, has_types, null_among, selector, to_columns
from hooktrace.schema import Trace, TraceFormatError
from hooktrace.validate import from_dict, load
from tests.trace_samples import realistic, sample, v1_dict, write

# JSON texts of single values, each parsed by orjson as `load` parses files.
_JSON_VALUES = [
    "0",
    "-0",
    "7",
    "-12",
    "140245819283264",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",  # past 64 bits: orjson reads a float
    "1.0",
    "-0.0",
    "1e5",
    "1E-3",
    "true",
    "false",
    "null",
    '"1"',
    '""',
    '"null"',
    "[]",
    "[1]",
    "{}",
    '{"a":1}',
]


def _exact(values, wanted):
    return all(type(v) in wanted for v in values)


@pytest.mark.parametrize("text", _JSON_VALUES)
@pytest.mark.parametrize("where", [0, 1, 2999])
def test_fast_column_checks_agree_with_per_value_checks(text, where):
    for filler in ("5", "null", "true"):
        column = orjson.loads(f"[{','.join([filler] * 3000)}]")
        column[where] = orjson.loads(text)
        assert all_ints(column) == _exact(column, {int}), (text, filler)
        assert all_ints(column, nullable=True) == _exact(column, {int, type(None)}), (text, filler)
        assert all_bools(column) == _exact(column, {bool}), (text, filler)
        for wanted in ({int}, {int, type(None)}, {bool}, {str, type(None)}):
            assert has_types(column, wanted, parsed=True) == _exact(column, wanted), (text, wanted)


def test_python_values_that_json_never_holds_take_the_per_value_check():
    """`from_dict` gets Python values (NaN, int subclasses): no shortcut is taken for them."""

    class Small(enum.IntEnum):
        ONE = 1

    for odd in (math.nan, math.inf, Small.ONE):
        column = [1, 2, odd]
        assert not has_types(column, {int}, parsed=False)
        assert not has_types(column, {int, type(None)}, parsed=False)
    data = sample().to_dict()
    data["events"]["columns"]["hook"][0] = math.nan
    with pytest.raises(TraceFormatError, match="hook"):
        from_dict(data)
    data = sample().to_dict()
    data["events"]["columns"]["start_ns"][2] = Small.ONE
    with pytest.raises(TraceFormatError, match="start_ns"):
        from_dict(data)


def test_selector_marks_where_a_column_holds_a_value():
    assert bytes(selector([0, 2, 1, 2], 2)) == b"\x00\x01\x00\x01"
    assert list(selector([0, 300, 2, -1], 2)) == [False, False, True, False]  # past a byte: compared


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("start_ns", True, "start_ns"),
        ("start_ns", 2.5, "start_ns"),
        ("seq", "7", "seq"),
        ("hook", 1.0, "hook"),
        ("returned", 1, "returned"),
        ("returned", None, "returned"),
        ("error", 0, "error"),
        ("type", 300, "index 300"),
        ("thread", -1, "index -1"),
        ("module", False, "module"),
        ("kind", 0.0, "kind"),
    ],
)
def test_one_bad_value_deep_in_a_large_file_is_refused(tmp_path, column, value, message):
    data = realistic(6000).to_dict()
    data["events"]["columns"][column][4321] = value
    with pytest.raises(TraceFormatError, match=message):
        load(write(tmp_path / "t.json", data))


def test_a_hook_event_without_hook_id_deep_in_a_large_file_is_refused(tmp_path):
    data = realistic(6000).to_dict()
    columns, tables = data["events"]["columns"], data["events"]["tables"]
    at = next(i for i in range(4000, 6000) if tables["type"][columns["type"][i]] == "hook")
    for name in ("hook", "kind"):
        bad = {**data, "events": {**data["events"], "columns": {**columns, name: list(columns[name])}}}
        bad["events"]["columns"][name][at] = None
        with pytest.raises(TraceFormatError, match="without a hook id or kind"):
            load(write(tmp_path / "t.json", bad))


def test_null_among_picked_values():
    picks = bytes([1, 0, 1, 0])
    assert null_among([1, None, 2**70, None], picks, ints=True) is False  # past 64 bits: still a sum
    assert null_among([1, 2, None, 4], picks, ints=True) is True
    assert null_among(["a", None, "b", None], picks, ints=False) is False
    assert null_among(["a", None, None, "b"], picks, ints=False) is True
    assert null_among([], b"", ints=True) is False


def test_a_version_1_hook_event_without_a_kind_is_refused(tmp_path):
    for name in ("kind", "hook"):
        data = v1_dict(realistic(3000))
        at = next(i for i in range(2000, 3000) if data["events"][i]["type"] == "hook")
        data["events"][at][name] = None
        with pytest.raises(TraceFormatError, match="without a hook id or kind"):
            load(write(tmp_path / "t.json", data))


def test_seq_increases_from_zero_or_more_and_never_repeats(tmp_path):
    t = sample()
    t.events = [e._replace(seq=e.seq + 5) for e in sample().events]  # increasing, from 5: accepted
    t.surprises[0].events = [8]
    assert load(write(tmp_path / "t.json", t.to_dict())).events == t.events
    t.surprises[0].events = [3]
    with pytest.raises(TraceFormatError, match=r"surprises\[0\] refers"):
        load(write(tmp_path / "t.json", t.to_dict()))
    t.surprises[0].events = []
    for seqs, dup in (([5, 6, 7, 6], 6), ([0, 1, 1, 3], 1), ([0, 0, 1, 2], 0)):  # unsorted and sorted
        t.events = [e._replace(seq=s) for e, s in zip(sample().events, seqs)]
        with pytest.raises(TraceFormatError, match=f"seq {dup} appears more than once"):
            load(write(tmp_path / "t.json", t.to_dict()))


BAD_SEQS = {
    "swapped": ([1, 0, 2, 3], "seq 0 comes after seq 1"),
    "reversed": ([3, 2, 1, 0], "seq 2 comes after seq 3"),
    "negative": ([-1, 0, 1, 2], "seq -1 is negative"),
    "all negative": ([-4, -3, -2, -1], "seq -4 is negative"),
    "last out of order": ([0, 1, 5, 4], "seq 4 comes after seq 5"),
}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("seqs", "words"), BAD_SEQS.values(), ids=list(BAD_SEQS))
def test_negative_or_out_of_order_seqs_are_refused(tmp_path, version, seqs, words):
    """docs/format.md: events are stored in the order they happened, seq counting from 0."""
    t = sample()
    t.events = [e._replace(seq=s) for e, s in zip(sample().events, seqs)]
    t.surprises[0].events = []
    data = v1_dict(t) if version == 1 else t.to_dict()
    with pytest.raises(TraceFormatError, match=words):
        load(write(tmp_path / "t.json", data))


@pytest.mark.parametrize("table", ["module", "kind", "type", "phase", "thread"])
def test_a_null_entry_in_an_events_table_is_refused(tmp_path, table):
    data = sample().to_dict()
    data["events"]["tables"][table].append(None)
    with pytest.raises(TraceFormatError, match=f'events table "{table}" holds null'):
        load(write(tmp_path / "t.json", data))


def test_surprise_events_are_checked_against_seq_zero_to_n(tmp_path):
    data = sample().to_dict()
    data["surprises"][0]["events"] = [4]
    with pytest.raises(TraceFormatError, match=r"surprises\[0\] refers"):
        load(write(tmp_path / "t.json", data))
    data["surprises"][0]["events"] = [0, 3]
    assert load(write(tmp_path / "t.json", data)).surprises[0].events == [0, 3]


def test_tables_are_sorted_and_null_stays_null():
    events = sample().to_dict()["events"]
    for table in events["tables"].values():
        assert table == sorted(table) and None not in table
    assert events["columns"]["kind"][0] is None and events["columns"]["hook"][0] is None
    mixed = to_columns([(1,), ("a",), (None,), (1,)], ["x"], ["x"])  # values that do not sort
    assert mixed["tables"]["x"] == [1, "a"] and mixed["columns"]["x"] == [0, 1, None, 0]


def test_large_version_1_file_with_one_bad_value_is_refused(tmp_path):
    data = v1_dict(realistic(3000))
    data["events"][2500]["duration_ns"] = 1.5
    with pytest.raises(TraceFormatError, match="duration_ns"):
        load(write(tmp_path / "t.json", data))
    data["events"][2500]["duration_ns"] = 3
    assert len(load(write(tmp_path / "t.json", data)).events) == 3000


def _generation(obj) -> int | None:
    return next((g for g in range(3) if any(o is obj for o in gc.get_objects(generation=g))), None)


def test_a_large_loaded_trace_goes_straight_to_the_oldest_gc_generation(tmp_path):
    """Its events live as long as the trace: no young-generation passes over them after load."""
    big, small = tmp_path / "big.json", tmp_path / "small.json"
    realistic(60_000).save(big)
    sample().save(small)
    gc.collect()
    young = []  # made just before: promoted with a large trace, left alone with a small one
    loaded = load(small)
    assert _generation(loaded.events[0]) == 0 and _generation(young) == 0
    loaded = load(big)
    assert gc.get_count()[0] < 1000
    assert _generation(loaded.events[0]) == _generation(loaded.events[-1]) == _generation(young) == 2


def test_objects_the_process_froze_stay_frozen(tmp_path):
    big = tmp_path / "big.json"
    realistic(60_000).save(big)
    kept = [object()]  # frozen by the process; load must not unfreeze it
    gc.collect()
    gc.freeze()
    try:
        # The count is not compared: a frozen object that dies meanwhile (pytest's, xdist's)
        # lowers it. What load must not do is move the frozen objects back into generation 2.
        assert _generation(kept) is None
        loaded = load(big)
        assert gc.get_freeze_count() > 0 and _generation(kept) is None
        assert _generation(loaded.events[0]) in (0, 1)
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("at, values", [(0, 15), (4095, 13), (4096, 15), (5999, 1)])
def test_events_of_another_length_are_not_saved(tmp_path, at, values):
    t = realistic(6000)
    t.events[at] = (tuple(t.events[at]) * 2)[:values]
    with pytest.raises(TraceFormatError, match=rf"events\[{at}\] has {values} values, expected 14"):
        t.save(tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_one_event_traces_decode_and_refuse_like_longer_ones(tmp_path):
    t = sample()
    t.events, t.surprises = t.events[:1], []
    assert load(write(tmp_path / "t.json", t.to_dict())).events == t.events
    data = t.to_dict()
    data["events"]["columns"]["module"] = [5]
    with pytest.raises(TraceFormatError, match="index 5, outside its table of 1"):
        load(write(tmp_path / "t.json", data))


def _mixed() -> Trace:
    t = sample()
    t.events[1] = tuple(t.events[1][:4]) + (7,) + tuple(t.events[1][5:])  # a module that is no string
    return t


@pytest.mark.parametrize(
    "make",
    [sample, Trace, lambda: realistic(10_000), lambda: realistic(4097), lambda: realistic(4096), _mixed],
    ids=["sample", "empty", "10000", "4097", "4096", "mixed-table"],
)
def test_saved_bytes_are_orjson_of_to_dict(tmp_path, make):
    """save and to_json write the columns slice by slice: exactly the bytes of dumps(to_dict())."""
    t = make()
    expected = orjson.dumps(t.to_dict()) + b"\n"
    assert t.to_json() == expected
    t.save(tmp_path / "t.json")
    assert (tmp_path / "t.json").read_bytes() == expected
    t.save(tmp_path / "t.json.gz")
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == expected
