"""The `order` format (docs/contract.md, Renderings) and what reads it: its parser, `hooktrace.diff`, `assert_order`,
`--check GOLDEN.txt [-q]` and `diff` over order files."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import pytest

import hooktrace
from hooktrace.analysis.diff import diff_traces
from hooktrace.compare import failure_message, read_side
from hooktrace.render import render
from hooktrace.render.order import OrderFormatError, order_lines, order_text, parse_order
from hooktrace.schema import Hook, Trace

from .test_cli import SAMPLES, invoke
from .test_diff import renumber, swap
from .test_renderers_all import SAMPLES as HAND_BUILT
from .test_renderers_all import Builder, two_layer

TWO_LAYER = """\
0 forward   <root>       forward_pre   global_pre [global]
0 forward   fc1          forward_pre   global_pre [global]
0 forward   fc1          forward_pre   early [prepend]
0 forward   fc1          forward_pre   cast_inputs [returned]
0 forward   fc1          forward       after_fc1 [with_kwargs] [always_call]
0 forward   act          forward_pre   global_pre [global]
0 forward   fc2          forward_pre   global_pre [global]
0 forward   fc2          forward       Recorder.after
0 backward  fc2          backward_pre  grad_out_fc2
0 backward  fc1          grad          weight_grad on fc1.weight
0 backward  fc1          backward      grad_fc1"""


def test_one_line_per_hook_call_with_step_phase_module_kind_hook_and_badges() -> None:
    trace = two_layer()
    assert order_lines(trace) == TWO_LAYER.splitlines()
    text = render(trace, "order")
    assert text == order_text(trace)
    lines = text.splitlines()
    assert lines[0].startswith("# hooktrace order 1: step phase module kind hook")
    assert lines[1:3] == ["", "# step 0 · forward"] and "# step 0 · backward" in lines
    assert len([x for x in lines if x and not x.startswith("#")]) == len(list(trace.hook_events()))


@pytest.mark.parametrize("sample", list(HAND_BUILT))
def test_reading_an_order_text_back_gives_the_same_text_and_the_same_order(sample: str) -> None:
    trace = HAND_BUILT[sample]()
    text = order_text(trace)
    back = parse_order(text)
    assert order_text(back) == text
    assert diff_traces(back, parse_order(order_text(back))).equal
    assert [e.type for e in back.events] == ["hook"] * len(list(trace.hook_events()))


def test_nothing_that_differs_between_runs_or_machines() -> None:
    a = two_layer()
    b = copy.deepcopy(a)
    shift = {h.id: h.id * 7 + 1000 for h in b.hooks}
    for h in b.hooks:
        h.id = shift[h.id]
        h.defined_at, h.registered_at, h.registered_by = "/elsewhere/m.py:9", "/x/y.py:99", None
        if h.prepend:
            h.prepend_source = "inferred"  # registered before the trace began: known from its position
    b.events = [
        e._replace(hook=shift.get(e.hook) if e.hook is not None else None, thread=99, start_ns=e.start_ns * 3,
                   duration_ns=e.duration_ns + 5)
        for e in b.events
    ]  # fmt: skip
    b.meta.torch, b.meta.python, b.meta.created, b.meta.target = (
        "2.14.1",
        "3.12.1",
        "2030-01-01",
        "/abs/m.py:make",
    )
    assert order_text(a) == order_text(b)
    assert "1000" not in order_text(b) and ".py" not in order_text(b)


@pytest.mark.parametrize(
    "name",
    [
        "two words",
        'quote"d',
        "[bracketed]",
        "#hash",
        "ünïcode",
        "tab\there",
        "esc\x1b[31m",
        "",
        "<root>",
        "-",
    ],
)
def test_any_name_is_one_token_that_reads_back(name: str) -> None:
    b = Builder((name or "x", "Linear"))
    h = b.hook("forward", name or "x", name)
    t = b.hook("grad", name or "x", "g", scope="tensor", tensor=f"output of {name}")
    b.enter(name or "x")
    b.fire(h, name or "x")
    b.exit(name or "x")
    b.fire(t, None, "backward")
    trace = b.trace()
    text = order_text(trace)
    assert "\x1b" not in text and "\t" not in text
    back = parse_order(text)
    assert [(h.name, h.tensor) for h in back.hooks] == [(name, None), ("g", f"output of {name}")]
    assert back.events[0].module == (name or "x") and order_text(back) == text


def test_scopes_owners_and_occurrences_read_back() -> None:
    b = Builder(("fc", "Linear"))
    unfired = b.hook("forward", "fc", "log")  # the first `log`: registered, never fired
    second = b.hook("forward", "fc", "log")
    node = b.hook("node", "fc", "after_acc", scope="node", tensor="fc.weight")
    opt = b.hook("optimizer_step_pre", None, "before_step", scope="optimizer")
    glob = b.hook("optimizer_step_post", None, "after_any", scope="global")
    pack = b.hook("pack", None, "count_pack", scope="saved_tensors")
    odd = b.hook("forward_pre", "other", "elsewhere")  # a module hook fired for another module's call
    b.enter("fc")
    b.fire(odd, "fc")
    b.fire(pack, "fc")
    b.fire(second, "fc")
    b.exit("fc")
    b.fire(node, "fc", "backward")
    b.fire(opt, None, "optimizer")
    b.fire(glob, None, "optimizer")
    trace = b.trace()
    assert unfired and order_lines(trace) == [
        "0 forward   fc           forward_pre   elsewhere of other",
        "0 forward   fc           pack          count_pack",
        "0 forward   fc           forward       log #2",
        "0 backward  fc           node          after_acc on fc.weight",
        "0 optimizer -            optimizer_step_pre before_step",
        "0 optimizer -            optimizer_step_post after_any [global]",
    ]
    back = parse_order(order_text(trace))
    got = {(h.name, h.scope, h.module, h.tensor) for h in back.hooks}
    assert got >= {("elsewhere", "module", "other", None), ("count_pack", "saved_tensors", None, None),
                   ("after_acc", "node", "fc", "fc.weight"), ("before_step", "optimizer", None, None),
                   ("after_any", "global", None, None)}  # fmt: skip
    assert [h.name for h in back.hooks].count("log") == 2  # the unfired first occurrence stands in
    assert diff_traces(back, parse_order(order_text(trace))).equal


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("x forward fc forward f", "line 2: the step must be a number"),
        ("0 sideways fc forward f", "line 2: unknown phase sideways"),
        ("0 forward fc           forwards f", "line 2: unknown hook kind forwards"),
        ("0 forward fc           forward f [shiny]", "line 2: unknown badge [shiny]"),
        ("0 forward fc           forward", "line 2: expected step, phase, module, kind and hook"),
        ('0 forward fc           forward "f', "line 2: an unterminated quoted name"),
        ("0 forward fc           forward f [prepend", "line 2: a badge without its closing ]"),
        ("0 forward fc           forward f with g", "line 2: unexpected with after the hook's name"),
    ],
)
def test_text_not_in_the_format_is_refused_naming_the_line(line: str, message: str) -> None:
    with pytest.raises(OrderFormatError, match=message.replace("[", r"\[")):
        parse_order(f"# a comment\n{line}\n")


def test_any_whitespace_between_fields_reads_as_spaces() -> None:
    """A hand-edited snapshot with tabs, or several spaces, reads as the written one; a quoted name
    keeps its spaces and its escaped tab."""
    b = Builder(("fc 1", "Linear"))
    h = b.hook("forward", "fc 1", "a name\twith a tab")
    b.enter("fc 1")
    b.fire(h, "fc 1")
    b.exit("fc 1")
    text = order_text(b.trace())
    line = order_lines(b.trace())[0]
    assert line.startswith('0 forward   "fc 1"       forward       "a name\\twith a tab"'), line
    tabbed = text.replace(line, "\t".join(line.split("   ")).replace("forward       ", "forward\t \t"))
    assert tabbed != text and "\t" in tabbed
    back = parse_order(tabbed)
    assert order_text(back) == text
    assert [(h.name, h.module) for h in back.hooks] == [("a name\twith a tab", "fc 1")]
    assert (
        order_lines(parse_order(TWO_LAYER.replace("   ", "\t").replace(" [", "\t[")))
        == TWO_LAYER.splitlines()
    )
    assert order_text(parse_order("0\tforward\tfc\tforward\tf\t[registered\tduring run]\n")).endswith(
        "f [registered during run]\n"
    )


@pytest.mark.parametrize("version", ["2", "0", "10", "x", "1.1"])
def test_an_unknown_format_version_is_refused(version: str) -> None:
    text = order_text(two_layer()).replace("# hooktrace order 1:", f"# hooktrace order {version}:")
    with pytest.raises(
        OrderFormatError, match=f"line 1: order format version {version}, which this hooktrace"
    ):
        parse_order(text)
    assert parse_order(order_text(two_layer()).replace("order 1:", "order 1 :")).events


# -- hooktrace.diff and assert_order --------------------------------------------------------------------------
def test_diff_takes_traces_sessions_paths_and_text(tmp_path: Path) -> None:
    trace = two_layer()
    (tmp_path / "t.json").write_bytes(trace.to_json())
    (tmp_path / "t.txt").write_text(order_text(trace), encoding="utf-8")

    class Session:
        def __init__(self, t: Trace) -> None:
            self.trace = t

    for a in (
        trace,
        Session(trace),
        tmp_path / "t.json",
        str(tmp_path / "t.txt"),
        order_text(trace),
        TWO_LAYER,
    ):
        for b in (trace, tmp_path / "t.txt", TWO_LAYER):
            result = hooktrace.diff(a, b)
            assert result.equal and str(result) == "same hook order: 11 hook calls in 1 step"
    moved = swap(trace, 4, 5)
    result = hooktrace.diff(tmp_path / "t.txt", moved)
    assert not result.equal and [d.change for d in result.differences] == ["moved"]
    assert str(result).startswith("hook order differs: 1 difference")
    with pytest.raises(FileNotFoundError):
        hooktrace.diff(trace, str(tmp_path / "missing.txt"))
    with pytest.raises(TypeError, match="cannot compare a int"):
        hooktrace.diff(trace, 3)


def test_equal_as_order_text_means_the_same_lines() -> None:
    """A trace against order text: what the lines leave out (hooks that never fired, how a prepend
    was known) plays no part; what they hold (returned, error) does."""
    trace = two_layer()
    more = copy.deepcopy(trace)
    more.hooks.append(Hook(999, "forward", "module", module="fc1", name="never_fired", prepend=True))
    assert hooktrace.diff(order_text(trace), more).equal
    flipped = copy.deepcopy(trace)
    flipped.events = [e._replace(returned=not e.returned) if e.seq == 5 else e for e in flipped.events]
    result = hooktrace.diff(order_text(trace), flipped)
    assert [d.change for d in result.differences] == ["returned"]
    assert "'cast_inputs' no longer returns a value" in str(result)


def test_interleaving_is_a_difference() -> None:
    """fc1 and fc2 each fire the same hooks, but the two calls run the other way round."""
    b = Builder(("fc1", "Linear"), ("fc2", "Linear"))
    h1, h2 = b.hook("forward", "fc1", "one"), b.hook("forward", "fc2", "two")
    for module, h in (("fc1", h1), ("fc2", h2)):
        b.enter(module)
        b.fire(h, module)
        b.exit(module)
    a = b.trace()
    other = renumber(a, a.events[3:] + a.events[:3])
    result = diff_traces(a, other)
    assert [d.change for d in result.differences] == ["interleaving"]
    assert "hook call 1 expected 'one' (forward hook of module 'fc1', forward, step 0), got 'two'" in str(
        result
    )
    assert not hooktrace.diff(order_text(a), other).equal


def test_assert_order_raises_with_the_summary_and_the_unified_diff() -> None:
    trace = two_layer()
    hooktrace.assert_order(trace, TWO_LAYER)
    moved = swap(trace, 4, 5)
    with pytest.raises(AssertionError) as info:
        hooktrace.assert_order(moved, TWO_LAYER)
    message = str(info.value)
    a, b = read_side(TWO_LAYER, "expected"), read_side(moved, "observed")
    assert message == failure_message(a, b, hooktrace.diff(TWO_LAYER, moved))
    assert (
        message.splitlines()[0]
        == "hook order differs: 1 difference (expected 11 hook calls in 1 step, got 11 in 1)"
    )
    assert "--- expected\n+++ observed\n@@ -1,7 +1,7 @@" in message
    assert "\n+0 forward   fc1          forward_pre   cast_inputs [returned]\n" in message
    assert "\n-0 forward   fc1          forward_pre   cast_inputs [returned]\n" in message


def test_the_diff_in_a_failure_numbers_the_lines_of_the_expected_file(tmp_path: Path) -> None:
    """`@@ -N` are lines of the golden file as written (headers, blank lines, hand-edited spacing);
    order text given without its format line is diffed without headers, as before."""
    golden = _saved(tmp_path, "golden.txt", two_layer())
    moved = swap(two_layer(), 17, 18)  # the last two hooks, below the forward ones and two headers
    with pytest.raises(AssertionError) as info:
        hooktrace.assert_order(moved, golden)
    message = str(info.value)
    lines = golden.read_text(encoding="utf-8").splitlines()
    assert lines[12:] == [
        "# step 0 · backward",
        "0 backward  fc2          backward_pre  grad_out_fc2",
        "0 backward  fc1          grad          weight_grad on fc1.weight",
        "0 backward  fc1          backward      grad_fc1",
    ]
    assert message.endswith(
        f"--- {golden}\n+++ observed\n@@ -12,5 +12,5 @@\n \n # step 0 · backward\n"
        " 0 backward  fc2          backward_pre  grad_out_fc2\n"
        "+0 backward  fc1          backward      grad_fc1\n"
        " 0 backward  fc1          grad          weight_grad on fc1.weight\n"
        "-0 backward  fc1          backward      grad_fc1"
    )
    edited = tmp_path / "edited.txt"
    hand = [x.replace("   ", "\t").replace("· backward", "·  backward") for x in lines]
    edited.write_text("\n".join(hand), encoding="utf-8")
    with pytest.raises(AssertionError) as info:
        hooktrace.assert_order(moved, edited)
    assert str(info.value).endswith(
        f"--- {edited}\n+++ observed\n@@ -12,5 +12,5 @@\n \n # step 0 ·  backward\n"
        f" {hand[13]}\n+0 backward  fc1          backward      grad_fc1\n {hand[14]}\n-{hand[15]}"
    )
    assert "\t" in hand[14]
    with pytest.raises(AssertionError) as info:
        hooktrace.assert_order(moved, "\n".join(order_lines(two_layer())))  # text without headers
    assert (
        "\n+++ observed\n@@ -7,5 +7,5 @@\n 0 forward   fc2          forward_pre   global_pre [global]\n"
        in str(info.value)
    )


def test_the_failure_diff_is_difflib_s_when_lines_are_as_written() -> None:
    import difflib
    import random

    from hooktrace.compare import _unified

    rng = random.Random(0)
    for _ in range(300):
        a = [rng.choice("abcde") for _ in range(rng.randrange(0, 30))]
        b = [rng.choice("abcde") for _ in range(rng.randrange(0, 30))]
        n = rng.randrange(0, 4)
        want = list(difflib.unified_diff(a, b, "x", "y", lineterm="", n=n))
        assert _unified(a, a, b, b, "x", "y", n) == (want or ["--- x", "+++ y"])


# -- the command line --------------------------------------------------------------------------------------------
def _saved(tmp_path: Path, name: str, trace: Trace) -> Path:
    path = tmp_path / name
    if name.endswith(".json"):
        trace.save(path)
    else:
        path.write_text(order_text(trace), encoding="utf-8")
    return path


def test_render_and_diff_with_order_files(tmp_path: Path) -> None:
    json_path = _saved(tmp_path, "a.json", two_layer())
    code, out, err = invoke("render", str(json_path), "-f", "order")
    assert code == 0 and out == order_text(two_layer())
    code, out, err = invoke("render", str(json_path), "-o", str(tmp_path / "a.txt"))
    assert code == 0 and (tmp_path / "a.txt").read_text(encoding="utf-8") == order_text(two_layer())
    code, out, _ = invoke("diff", str(tmp_path / "a.txt"), str(json_path))
    assert code == 0 and out == f"same hook order: {tmp_path / 'a.txt'} and {json_path}\n"
    assert invoke("diff", "-q", str(tmp_path / "a.txt"), str(json_path))[:2] == (0, "")
    moved = _saved(tmp_path, "b.txt", swap(two_layer(), 4, 5))
    code, out, _ = invoke("diff", "-q", str(tmp_path / "a.txt"), str(moved))
    assert code == 1 and out.startswith("hook order differs: 1 difference") and "'early' moved" in out


def test_an_unreadable_order_file_is_exit_2_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("# hooktrace order 1\n0 forward fc           forwards f\n", encoding="utf-8")
    code, out, err = invoke("diff", str(bad), str(bad))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot read {bad}: line 2: unknown hook kind forwards")
    code, _, err = invoke("diff", str(tmp_path / "none.txt"), str(bad))
    assert code == 2 and "file not found" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("# hooktrace order 2: step phase\n\n0 forward fc forward f\n", "line 1: order format version 2, "
         "which this hooktrace does not read (it reads version 1)"),
        ("", "not an order file: it is empty (# hooktrace order 1: ...)"),
        ("\n# a comment\n", "not an order file: its first line is not the format line"),
        ("0 forward fc forward f\n", "not an order file: its first line is not the format line"),
        (b"\xff\xfe x", "neither a saved trace nor an order file (not UTF-8 text)"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_an_order_file_of_this_version_is_refused(
    tmp_path: Path, content: Any, message: str
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    good = _saved(tmp_path, "good.txt", two_layer())
    for args in (("diff", str(bad), str(good)), ("diff", str(good), str(bad))):
        code, out, err = invoke(*args)
        assert (code, out) == (2, "") and err.count("\n") == 1, err
        assert err.startswith(f"error: cannot read {bad}: {message}"), err
    code, out, err = invoke("run", str(SAMPLES / "quickstart.py"), "--check", str(bad), "-q")
    assert (code, out) == (2, "") and err.startswith(f"error: cannot read {bad}: {message}"), err
    with pytest.raises(OrderFormatError, match=re.escape(f"{bad}: {message}")):
        hooktrace.diff(bad, two_layer())
    with pytest.raises(OrderFormatError, match=re.escape(f"{bad}: {message}")):
        hooktrace.assert_order(two_layer(), str(bad))


def test_render_says_an_order_file_is_compared_with_diff(tmp_path: Path) -> None:
    order = _saved(tmp_path, "x.txt", two_layer())
    code, out, err = invoke("render", str(order))
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err == (
        f"error: cannot read {order}: it is an order file; render and ranks take saved traces (.json, .json.gz; "
        "hooktrace run -o FILE.json writes one); compare order files with hooktrace diff\n"
    )
    other = tmp_path / "notes.txt"
    other.write_text("hello\n", encoding="utf-8")
    code, _, err = invoke("render", str(other))
    assert code == 2 and err.startswith(f"error: cannot read {other}: {other} is not valid JSON"), err


def test_a_string_that_reads_like_a_path_is_one(tmp_path: Path) -> None:
    """One line ending in .txt, .json or .gz, or naming a file or folder: a path, which must exist
    and be a file; anything else is order text."""
    trace = two_layer()
    for missing in ("my golden.txt", str(tmp_path / "no such.json"), "x.json.gz", "x.TXT.GZ"):
        with pytest.raises(FileNotFoundError, match=re.escape(missing)):
            hooktrace.diff(trace, missing)
    for folder in (str(tmp_path), tmp_path, str(tmp_path / "d.txt")):
        (tmp_path / "d.txt").mkdir(exist_ok=True)
        with pytest.raises(IsADirectoryError, match=re.escape(str(folder))):
            hooktrace.diff(trace, folder)
    spaced = tmp_path / "my golden.txt"
    spaced.write_text(order_text(trace), encoding="utf-8")
    assert hooktrace.diff(trace, str(spaced)).equal
    with pytest.raises(OrderFormatError, match="line 1: expected step"):
        hooktrace.diff(trace, "golden")  # one word, no path ending, no such file: order text


def test_check_against_an_order_file_quiet(tmp_path: Path) -> None:
    quickstart = str(SAMPLES / "quickstart.py")
    golden = tmp_path / "golden.txt"
    code, _, err = invoke("run", quickstart, "-o", str(golden))
    assert code == 0 and golden.read_text(encoding="utf-8").startswith("# hooktrace order 1")
    assert invoke("run", quickstart, "--check", str(golden), "-q") == (0, "", "")
    code, out, err = invoke("run", quickstart, "--check", str(golden))
    assert code == 0 and "first_pre [prepend]" in out and "same hook order" in err
    changed = golden.read_text(encoding="utf-8").replace("first_pre [prepend]", "first_pre")
    golden.write_text(changed, encoding="utf-8")
    code, out, err = invoke("run", quickstart, "--check", str(golden), "-q")
    assert code == 1 and out == ""
    assert err.startswith("hook order differs: 1 difference")
    assert "'first_pre' (module hook): prepend False → True" in err
    code, _, err = invoke("run", quickstart, "-q")
    assert code == 2 and err == "error: -q goes with --check GOLDEN; add --check or drop -q\n"


# -- real runs: the samples, and changed orders ------------------------------------------------------------------
def model_run(prepend: bool = True, extra: bool = False, swapped: bool = False) -> Any:
    """A tiny model run under `hooktrace.trace`: prepend removed, a hook added, or hooks swapped
    across modules when asked."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))

    def cast(*_: Any) -> None:
        return None

    def early(*_: Any) -> None:
        return None

    def audit(*_: Any) -> None:
        return None

    def log(*_: Any) -> None:
        return None

    first, second = (model[2], model[0]) if swapped else (model[0], model[2])
    first.register_forward_hook(log)
    second.register_forward_hook(audit)
    model[0].register_forward_pre_hook(cast)
    model[0].register_forward_pre_hook(early, prepend=prepend)
    if extra:
        model[2].register_forward_pre_hook(audit)
    with hooktrace.trace(model) as t:
        model(torch.randn(2, 3)).sum().backward()
    return t


def test_changed_orders_fail_with_a_diff_a_reviewer_understands() -> None:
    golden = order_text(model_run().trace)
    hooktrace.assert_order(model_run(), golden)
    messages: dict[str, str] = {}
    for name, kwargs in (
        ("prepend", {"prepend": False}),
        ("added", {"extra": True}),
        ("swapped", {"swapped": True}),
    ):
        with pytest.raises(AssertionError) as info:
            hooktrace.assert_order(model_run(**kwargs), golden)
        messages[name] = str(info.value)
    prefix = "0 forward   0            forward_pre   model_run.<locals>."
    assert f"-{prefix}early [prepend]\n" in messages["prepend"]
    assert f"+{prefix}early\n" in messages["prepend"]
    assert "'model_run.<locals>.early' moved from position 1 to 2 of 2" in messages["prepend"]
    assert "prepend True → False" in messages["prepend"]
    assert "+0 forward   2            forward_pre   model_run.<locals>.audit\n" in messages["added"]
    assert "'model_run.<locals>.audit' fired 1× (not expected)" in messages["added"]
    swapped = messages["swapped"].splitlines()
    assert swapped[0].startswith("hook order differs: 2 differences")
    assert swapped[2:4] == [
        "  - step 0, forward, module '0', forward hooks: 'model_run.<locals>.log' fired for module '2' instead of '0' (1×)",
        "  - step 0, forward, module '2', forward hooks: 'model_run.<locals>.audit' fired for module '0' instead of '2' (1×)",
    ]
    assert swapped[-2:] == [
        "+0 forward   0            forward       model_run.<locals>.audit",
        "+0 forward   2            forward       model_run.<locals>.log",
    ]


def _run_order(sample: str, tmp_path: Path, n: int) -> str:
    out = tmp_path / f"{sample}.{n}.txt"
    code, _, err = invoke("run", str(SAMPLES / f"{sample}.py"), "-f", "order", "-o", str(out))
    assert code in (0, 1), err  # always_call's forward raises: exit 1, the trace is still written
    return out.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "sample",
    ["quickstart", "prepend_displaced", "backward_order", "checkpoint_recompute", "quantization", "always_call",
     "training_step", "saved_tensors", "forward_wrapper"],
)  # fmt: skip
def test_sample_order_snapshots_are_stable(
    sample: str, tmp_path: Path, golden: Callable[[str, str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(SAMPLES.parent)
    first, second = _run_order(sample, tmp_path, 1), _run_order(sample, tmp_path, 2)
    assert first == second
    golden(f"order/{sample}.txt", first)


@pytest.mark.slow  # two ranks through torch's launcher: about 30 s on this VM
def test_check_quiet_with_ranks(tmp_path: Path) -> None:
    sample = str(SAMPLES / "fsdp_two_ranks.py")
    code, out, err = invoke("run", sample, "--nproc", "2", "-f", "order")
    assert code == 0, err
    golden = tmp_path / "golden.txt"
    golden.write_text(out, encoding="utf-8")
    assert invoke("run", sample, "--nproc", "2", "--check", str(golden), "-q") == (0, "", "")
    golden.write_text(out.replace("FSDPState._post_forward\n", "FSDPState._post_forward [prepend]\n"))
    code, out, err = invoke("run", sample, "--nproc", "2", "--check", str(golden), "-q")
    assert code == 1 and out == "" and err.startswith("hook order differs: 3 differences")


def test_check_quiet_says_nothing_when_equal_even_with_notes(tmp_path: Path) -> None:
    """A run with notes (backward skipped): -q still prints nothing when the order is equal; the
    nearest case, without -q, says the note."""
    sample = str(SAMPLES / "quickstart.py")
    golden = tmp_path / "golden.txt"
    assert invoke("run", sample, "--no-backward", "-o", str(golden))[0] == 0
    assert invoke("run", sample, "--no-backward", "--check", str(golden), "-q") == (0, "", "")
    code, _, err = invoke("run", sample, "--no-backward", "--check", str(golden))
    assert code == 0 and "note: backward skipped (--no-backward)" in err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0 forward fc forward f #99999999999", "line 2: the occurrence must be #2 to #100000"),
        ("0 forward fc forward f #\u00b2", "line 2: the occurrence must be #2 to #100000"),
        ("\u00b2 forward fc forward f", "line 2: the step must be a number of at most 12 digits"),
        ("9" * 5000 + " forward fc forward f", "line 2: the step must be a number of at most 12 digits"),
        ("0 forward fc forward f #" + "9" * 5000, "line 2: the occurrence must be #2 to #100000"),
    ],
)
def test_numbers_in_an_order_file_are_bounded(tmp_path: Path, line: str, message: str) -> None:
    """`#99999999999` made `diff` grow without end (a stand-in per unwritten occurrence); `²` and
    5,000 digits gave an internal ValueError: now one `error:` line, exit 2."""
    bad = tmp_path / "bad.txt"
    bad.write_text(f"# hooktrace order 1\n{line}\n", encoding="utf-8")
    with pytest.raises(OrderFormatError, match=re.escape(message)):
        parse_order(bad.read_text(encoding="utf-8"), as_file=True)
    code, out, err = invoke("diff", str(bad), str(bad))
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: cannot read {bad}: {message}"), err


def test_unwritten_occurrences_are_bounded_over_the_whole_file() -> None:
    lines = "".join(f"0 forward fc forward f{i} #90000\n" for i in range(3))
    with pytest.raises(OrderFormatError, match="more than 100000 occurrences of hooks unwritten"):
        parse_order(lines)
    assert len(parse_order("0 forward fc forward f #3\n").hooks) == 3  # two unwritten: stand-ins
