"""Version 2's column layout (docs/format.md): rows of events to columns and tables and back, and the
checks that look at a whole column at C speed. The bytes are `io`'s; what the values mean, `validate`'s.
"""

from __future__ import annotations

import operator
import sys
from itertools import chain, compress, repeat
from typing import Any, Iterable, Optional, Sequence

import orjson

from . import TraceFormatError, dumps, short

_STRICT = {"strict": True} if sys.version_info >= (3, 10) else {}  # zip() checks the rows' lengths
_TRANSPOSE_ROWS = 4096  # rows transposed at a time: faster than zip(*rows) at once (benchmarks/README.md)


_INT_BYTES = b"0123456789-,"
_INT_NULL_BYTES = _INT_BYTES + b"nul"


def all_ints(values: list[Any], nullable: bool = False) -> bool:
    """True when every value is an int (never a bool), or None when `nullable`, checked at C speed;
    only for lists that `loads` made (JSON's types alone, no NaN): orjson writes such a list back
    with digits, '-', ',' and 'null' alone, and any other value with some other character ('true',
    '1.0', '1e+20', '"1"', '[', '{'). False means "look closer" (an int past 64 bits, say)."""
    try:
        text = orjson.dumps(values)
    except orjson.JSONEncodeError:
        return False
    return text.translate(None, _INT_NULL_BYTES if nullable else _INT_BYTES) == b"[]"


def all_bools(values: list[Any]) -> bool:
    """True when every value is true or false, checked like `all_ints` (only 'true', 'false', ',')."""
    try:
        text = orjson.dumps(values)
    except orjson.JSONEncodeError:
        return False
    return text.translate(None, b"truefals,") == b"[]"


def has_types(values: list[Any], wanted: set[type], parsed: bool) -> bool:
    """Every value's type is in `wanted`: a whole column at C speed where it can be (`all_ints` and
    `all_bools` only when `parsed`, i.e. the list is what `loads` made)."""
    if wanted == {str, type(None)} and values.count(None) == len(values):
        return True
    if parsed and wanted <= {int, type(None)} and all_ints(values, nullable=type(None) in wanted):
        return True
    if parsed and wanted == {bool} and all_bools(values):
        return True
    return set(map(type, values)) <= wanted


def selector(column: list[Any], value: int) -> Sequence[Any]:
    """Truthy where `column` (ints) holds `value`, for `itertools.compress`: bytes made at C speed
    when every int fits in one."""
    try:
        return bytes(column).translate(bytes(i == value for i in range(256)))
    except (ValueError, TypeError):  # an int past 255 or below 0
        return list(map(operator.eq, column, repeat(value)))


def null_among(column: list[Any], picks: Sequence[Any], ints: bool) -> bool:
    """True when a value that `picks` picks (itertools.compress) is None. For a column of ints or
    None, sum() meets a None as a TypeError in half the time `None in` takes to compare each value."""
    picked = compress(column, picks)
    if not ints:
        return None in picked
    try:
        sum(picked)
    except TypeError:
        return True
    return False


def to_columns(
    rows: Sequence[Sequence[Any]], fields: Sequence[str], indexed: Iterable[str], width: int = 0
) -> dict[str, Any]:
    """`{"count", "columns", "tables"}` of the first len(fields) of rows of `width` (or len(fields)) values:
    `indexed` fields hold indices into a table of their distinct values (sorted; null stays null)."""
    slices, tables = _transposed(rows, fields, indexed, width)
    columns = {name: list(chain.from_iterable(parts)) for name, parts in zip(fields, slices)}
    return {"count": len(rows), "columns": columns, "tables": tables}


def columns_json(
    rows: Sequence[Sequence[Any]], fields: Sequence[str], indexed: Iterable[str], width: int = 0
) -> list[bytes]:
    """Chunks of exactly the bytes `dumps(to_columns(rows, fields, indexed, width))` makes, without
    whole columns: orjson writes each slice of each column, so no column is built and the document
    is never copied into one piece."""
    slices, tables = _transposed(rows, fields, indexed, width)
    chunks = [b'{"count":%d,"columns":{' % len(rows)]
    for i, (name, parts) in enumerate(zip(fields, slices)):
        chunks.append(b'%s"%s":[' % (b"," if i else b"", name.encode()))
        chunks.append(b",".join([dumps(part)[1:-1] for part in parts]))
        chunks.append(b"]")
    chunks += [b'},"tables":', dumps(tables), b"}"]
    return chunks


def _transposed(
    rows: Sequence[Sequence[Any]], fields: Sequence[str], indexed: Iterable[str], width: int
) -> tuple[list[list[tuple[Any, ...]]], dict[str, list[Any]]]:
    """Each field's values as tuples of up to _TRANSPOSE_ROWS rows (slices keep the transposition
    in the CPU caches), indexed fields' values replaced by indices; and the tables."""
    width = width or len(fields)
    if not _STRICT and rows and set(map(len, rows)) != {width}:
        raise _length_error(rows, width)
    slices: list[list[tuple[Any, ...]]] = [[] for _ in fields]
    for start in range(0, len(rows), _TRANSPOSE_ROWS):
        try:  # strict: rows of unequal length raise; then `width` parts mean `width` values each
            transposed = list(zip(*rows[start : start + _TRANSPOSE_ROWS], **_STRICT))
        except ValueError:
            raise _length_error(rows, width) from None
        if len(transposed) != width:
            raise _length_error(rows, width)
        for parts, part in zip(slices, transposed):
            parts.append(part)
    tables: dict[str, list[Any]] = {}
    for name in indexed:
        parts = slices[fields.index(name)]
        tables[name] = table = _table(parts)
        index: dict[Any, Any] = {v: i for i, v in enumerate(table)}
        index[None] = None
        # itemgetter looks every value up in one C call: half of map(index.__getitem__, ...)
        parts[:] = [operator.itemgetter(*p)(index) if len(p) > 1 else (index[p[0]],) for p in parts]
    return slices, tables


def _length_error(rows: Sequence[Sequence[Any]], width: int) -> TraceFormatError:
    bad = next(i for i, r in enumerate(rows) if len(r) != width)
    return TraceFormatError(f"events[{bad}] has {len(rows[bad])} values, expected {width}")


def _table(parts: list[tuple[Any, ...]]) -> list[Any]:
    """The distinct values but null, sorted (values that do not sort: first seen first)."""
    distinct = set().union(*parts)
    distinct.discard(None)
    try:
        return sorted(distinct)
    except TypeError:
        return [v for v in dict.fromkeys(chain.from_iterable(parts)) if v is not None]


def from_columns(
    data: Any, fields: Sequence[str], required_tables: Sequence[str], optional_tables: Sequence[str] = (),
    optional: Sequence[str] = ()) -> tuple[list[Optional[list[Any]]], dict[str, Any]]:  # fmt: skip
    """The columns of a `to_columns` document in `fields` order (None for a column in `optional` that
    it does not have; the table of one it has is required), and the tables named, after checking the
    layout: every column a list of `count` values. Other columns and tables are ignored (docs/format.md).
    The values, and the indices in the columns that have a table, are the caller's to check."""
    if not isinstance(data, dict) or set(data) != {"count", "columns", "tables"}:
        raise TraceFormatError('"events" must be an object with the keys "count", "columns" and "tables"')
    count, columns, tables = data["count"], data["columns"], data["tables"]
    if type(count) is not int or count < 0:
        raise TraceFormatError(f'"events"."count" must be a non-negative integer, got {short(count)}')
    required = [f for f in fields if f not in optional]
    if not isinstance(columns, dict) or not set(required) <= set(columns):
        got = sorted(columns) if isinstance(columns, dict) else type(columns).__name__
        raise TraceFormatError(
            f'"events"."columns" must have the columns {", ".join(required)}; got {short(got)}'
        )
    wanted = [*required_tables, *(t for t in optional_tables if t in optional and t in columns)]
    if not isinstance(tables, dict) or not set(wanted) <= set(tables):
        raise TraceFormatError(f'"events"."tables" must have the tables {", ".join(wanted)}')
    tables = {name: tables[name] for name in (*required_tables, *optional_tables) if name in tables}
    for name, table in tables.items():
        if not isinstance(table, list):
            raise TraceFormatError(f'events table "{name}" must be a list')
    out: list[Optional[list[Any]]] = []
    for name in fields:
        column = columns.get(name)
        if (name in columns or name in required) and (not isinstance(column, list) or len(column) != count):
            raise TraceFormatError(f'events column "{name}" must be a list of {count} values')
        out.append(column)
    return out, tables


def lookup(table: list[Any]) -> dict[Any, Any]:
    """Index -> value of a version 2 table, and null -> null."""
    out: dict[Any, Any] = dict(enumerate(table))
    out[None] = None
    return out


def decode(column: list[Any], table: list[Any]) -> Sequence[Any]:
    """The values a column of checked indices (ints, never bools, or null) stands for, looked up in
    one itemgetter call (faster than map()); KeyError for an index outside the table."""
    known = lookup(table)
    return operator.itemgetter(*column)(known) if len(column) > 1 else [known[v] for v in column]


def index_error(name: str, column: list[Any], table: list[Any]) -> Optional[TraceFormatError]:
    """The error for the first index in `column` outside `table`, or None if there is none."""
    known = lookup(table)
    bad = next((v for v in column if v not in known), known)
    if bad is known:
        return None
    return TraceFormatError(
        f'events column "{name}" holds index {short(bad)}, outside its table of {len(table)}'
    )
