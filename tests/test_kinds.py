"""The kinds table (hooktrace/kinds.py) against PyTorch itself: every hook dict and `register_*`
name a row gives exists where the row says, every kind PyTorch calls gets the number of positional
arguments the row says, and every table keyed by kind, phase or family covers all of them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module

from hooktrace import kinds
from hooktrace.capture import dicts, registry, shims
from hooktrace.kinds import GLOBAL, MODULE, OPTIMIZER, PHASES, TABLE, TENSOR, K


def _owner(scope: str, kind: str) -> Any:
    """Where a row's dict attributes and register_* names of `scope` live."""
    if scope == GLOBAL:
        return optim_module if kind in kinds.OPTIMIZER_KINDS else nn_module
    if scope == MODULE:
        return torch.nn.Linear(2, 2)
    if scope == TENSOR:
        return torch.zeros(2, requires_grad=True)
    assert scope == OPTIMIZER
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


@pytest.mark.parametrize("kind", list(TABLE))
def test_a_rows_dicts_and_register_names_exist_in_pytorch(kind: str) -> None:
    info = TABLE[kind]
    assert info.name == kind and info.scopes and info.label
    for scope, attr in info.dicts:
        assert scope in info.scopes
        assert hasattr(_owner(scope, kind), attr), (scope, attr)
    for scope, name in info.registers:
        assert scope in info.scopes
        assert callable(getattr(_owner(scope, kind), name)), (scope, name)
    for scope, attr, _flag in info.flags:
        assert scope in info.scopes
        assert isinstance(getattr(_owner(scope, kind), attr), dict), (scope, attr)


def test_the_flags_a_row_names_are_the_ones_pytorch_records() -> None:
    """Each with_kwargs / always_call that PyTorch takes is found through the rows' `flags`."""
    from hooktrace.capture import dicts

    m = torch.nn.Linear(2, 2)
    pre = m.register_forward_pre_hook(lambda mod, args, kwargs: None, with_kwargs=True)
    both = m.register_forward_hook(lambda mod, args, kwargs, out: None, with_kwargs=True, always_call=True)
    plain = m.register_forward_hook(lambda mod, args, out: None)
    g = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: None, always_call=True)
    try:
        assert dicts.module_flags(m, K.forward_pre, pre.id) == (True, False)
        assert dicts.module_flags(m, K.forward, both.id) == (True, True)
        assert dicts.module_flags(m, K.forward, plain.id) == (False, False)
        assert dicts.module_flags(None, K.forward, g.id) == (False, True)
    finally:
        g.remove()


def _fire(kind: str, record: list[int]) -> None:
    """Register a hook of `kind` that records how many positional arguments it got, and run it."""

    def hook(*args: Any) -> None:
        record.append(len(args))

    linear = torch.nn.Linear(2, 2)
    x = torch.randn(1, 2, requires_grad=True)
    if kind in ("forward_pre", "forward", "backward_pre", "backward", "backward_legacy"):
        name = dict(kinds.registers_of(MODULE))
        inverse = {k: n for n, k in name.items()}
        getattr(linear, inverse[kind])(hook)
        linear(x).sum().backward()
    elif kind in ("grad", "post_accumulate_grad"):
        inverse = {k: n for n, k in kinds.registers_of(TENSOR)}
        getattr(linear.weight, inverse[kind])(hook)
        linear(x).sum().backward()
    elif kind in ("node_pre", "node"):
        out = linear(x).sum()
        (out.grad_fn.register_prehook if kind == "node_pre" else out.grad_fn.register_hook)(hook)
        out.backward()
    elif kind in ("pack", "unpack"):

        def pack(t: Any) -> Any:
            if kind == "pack":
                hook(t)
            return t

        def unpack(t: Any) -> Any:
            if kind == "unpack":
                hook(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = (x * x).sum()
        out.backward()
    elif kind in kinds.OPTIMIZER_KINDS:
        opt = torch.optim.SGD(linear.parameters(), lr=0.1)
        inverse = {k: n for n, k in kinds.registers_of(OPTIMIZER)}
        getattr(opt, inverse[kind])(hook)
        linear(x).sum().backward()
        opt.step()
        state = opt.state_dict()
        opt.load_state_dict(state)
    else:
        raise AssertionError(f"no way to fire {kind} here")


# `comm` is called by DDP's reducer alone (tests/test_capture_wrappers.py runs it)
@pytest.mark.parametrize("kind", [k for k, info in TABLE.items() if info.args is not None and k != "comm"])
@pytest.mark.filterwarnings("ignore:Using a non-full backward hook")
def test_pytorch_passes_a_kind_the_positional_arguments_its_row_says(kind: str) -> None:
    record: list[int] = []
    _fire(kind, record)
    assert record, f"{kind} did not fire"
    assert set(record) == {TABLE[kind].args}, (kind, record)


def test_tables_keyed_by_kind_phase_or_family_cover_every_one() -> None:
    from hooktrace.render import badges, dot

    assert set(shims.ARITY) == {k for k, info in TABLE.items() if info.args is not None}
    assert set(badges.PHASE_TITLES) == set(PHASES)
    assert set(dot.PHASE_FILL) == set(PHASES)
    used = {info.family for info in TABLE.values()} - {None}
    assert used == set(kinds.FAMILIES)  # every family has legend words and a fill, and is used
    # every kind with a family has a terminal colour, and the reverse (the renderers' own tables are
    # checked against what they draw in tests/test_render_kinds.py)
    assert {k for k in TABLE if TABLE[k].family} == {k for k in TABLE if TABLE[k].style}
    # every dict the capture walks is a row's, and every row's dict is walked
    walked = dicts.MODULE_DICTS + dicts.GLOBAL_DICTS + dicts.GLOBAL_OPTIMIZER_DICTS + dicts.OPTIMIZER_DICTS
    walked += dicts.TENSOR_DICTS
    assert sorted(walked) == sorted((attr, k) for k, info in TABLE.items() for _, attr in info.dicts)
    intercepted = registry.MODULE_METHODS + registry.GLOBAL_FUNCTIONS + registry.OPTIMIZER_METHODS
    intercepted += registry.OPTIMIZER_FUNCTIONS + registry.TENSOR_METHODS
    assert sorted(intercepted) == sorted((name, k) for k, info in TABLE.items() for _, name in info.registers)


# -- no kind, phase, scope or event type spelled outside kinds.py ---------------------------------------
WORDS = set(kinds.KINDS) | set(kinds.SCOPES) | set(PHASES) | set(kinds.EVENT_TYPES) | {kinds.ROOT}
NOT_A_KIND = "# not a kind"  # on a line, or the line above it: its word only looks like one (an option)
# calls whose string arguments are words for people or attribute names, never a kind looked up
_TEXT_CALLS = ("Surprise", "plural", "getattr", "hasattr", "setattr", "attr")


def _spelled(path: Path) -> list[tuple[int, str]]:
    """String constants in `path` that are a kind, phase, scope, event type or the root label, outside
    docstrings, f-strings, `__slots__`, words passed to `_TEXT_CALLS`, record field names (dict keys
    beside other keys, subscripts by a field name) and marked lines. A dict keyed only by such words,
    a subscript by a kind and a `startswith` argument count: a table keyed by kind, or a kind told by
    its name, is one more place to edit when a kind is added."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    skip: set[int] = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body:
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        if isinstance(n, ast.Dict):  # a record's field names pass; a table keyed by kinds or phases does not
            keys = [k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if len(keys) < 2 or not set(keys) <= WORDS:
                skip.update(id(k) for k in n.keys if k is not None)
        elif isinstance(n, ast.Subscript):  # d["module"] (a field) passes; d["pack"] (a kind) does not
            if not (isinstance(n.slice, ast.Constant) and n.slice.value in kinds.KINDS):
                skip.add(id(n.slice))
        elif isinstance(n, ast.JoinedStr):
            skip.update(id(v) for v in n.values)
        elif isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if name in _TEXT_CALLS:
                skip.update(id(c) for a in n.args for c in ast.walk(a))
        elif isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in n.targets):
            skip.update(id(c) for c in ast.walk(n.value))
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value in WORDS
        and id(n) not in skip
        and NOT_A_KIND not in lines[n.lineno - 1] + lines[n.lineno - 2]
    ]


def test_no_kind_phase_scope_or_event_type_is_spelled_outside_kinds_py() -> None:
    """They come from kinds.py (`K.forward_pre`, `FORWARD`, `MODULE`, `HOOK`), so a kind is added,
    renamed or found in one place."""
    package = Path(kinds.__file__).parent
    found = {
        str(p.relative_to(package.parent)): hits
        for p in sorted(package.rglob("*.py"))
        if p.name != "kinds.py" and (hits := _spelled(p))
    }
    assert not found, found


def test_the_spelling_check_finds_a_spelled_kind(tmp_path: Path) -> None:
    code = tmp_path / "x.py"
    code.write_text(
        '"""forward"""\nif e.kind == "forward_pre" or e.phase != "recompute":\n    d = {"module": 1}\n'
    )
    assert _spelled(code) == [(2, "forward_pre"), (2, "recompute")]
    code.write_text('x = "node"  # not a kind\nplural(2, "hook")\n')
    assert _spelled(code) == []


def test_the_spelling_check_finds_tables_keyed_by_kind_and_kinds_told_by_name(tmp_path: Path) -> None:
    code = tmp_path / "x.py"
    code.write_text(
        'FILL = {"forward": 1, "backward": 2}\n'  # a table keyed by phases
        'style = STYLES["pack"]\n'  # a subscript by a kind
        'k.startswith("optimizer")\n'  # a kind told by its name
        'row = {"module": m, "hook": h, "seq": 1}\n'  # a record's fields: fine
        'path = event["module"]\n'
    )
    assert sorted(_spelled(code)) == [(1, "backward"), (1, "forward"), (2, "pack"), (3, "optimizer")]


def test_what_a_returned_value_means_covers_every_kind_and_agrees_with_the_rows() -> None:
    """capture/returned.py's SAME (is the value returned the one PyTorch passed?) has every kind;
    a kind whose returned value PyTorch ignores has no `returned` words in its row, and the reverse."""
    from hooktrace.capture import returned

    assert set(returned.SAME) == set(TABLE)
    assert returned.RETURN_IGNORED == {k for k, info in TABLE.items() if info.returned is None}
