"""The rich tree renderer: hand-built traces (nesting, badges, errors, collapse, filters, steps) and,
when the capture engine is there, real traces of a tiny model."""

from __future__ import annotations

import re
from typing import Any, Optional

import pytest

from hooktrace.render import RenderError
from hooktrace.render.tree import build_tree, tree_text
from hooktrace.schema import Event, Hook, Meta, Module, Surprise, Trace


class TraceBuilder:
    """Hand-built traces: events get seq in call order, times 1 µs apart."""

    def __init__(self, modules: tuple[tuple[str, str], ...] = (("", "Net"),)) -> None:
        self.modules = [Module(p, t) for p, t in modules]
        self.hooks: list[Hook] = []
        self.events: list[Event] = []
        self.surprises: list[Surprise] = []
        self.open: dict[tuple[str, int], list[int]] = {}
        self.step = 0
        self.next_id = 1
        self.lines: dict[str, int] = {}
        self.kinds: dict[int, str] = {}

    def add_module(self, path: str, type_: str) -> None:
        self.modules.append(Module(path, type_))

    def hook(self, kind: str, module: Optional[str] = None, name: str = "", **fields: Any) -> int:
        hid = self.next_id
        self.next_id += 1
        self.kinds[hid] = kind
        scope = fields.pop("scope", "module" if module is not None else "global")
        self.hooks.append(
            Hook(
                id=hid,
                kind=kind,
                scope=scope,
                module=module,
                name=name or f"{kind}_hook_{hid}",
                defined_at=f"model.py:{self.lines.setdefault(name, 10 + len(self.lines))}",
                **fields,
            )
        )
        return hid

    def _event(
        self,
        type_: str,
        phase: str,
        module: Optional[str],
        hook: Optional[int] = None,
        kind: Optional[str] = None,
        returned: bool = False,
        error: Optional[str] = None,
        thread: int = 1,
    ) -> int:
        seq = len(self.events)
        dur = 500 if type_ == "hook" else 0
        self.events.append(
            Event(seq, self.step, type_, phase, module, hook, kind, thread, seq * 1000, dur, returned, error)
        )
        return seq

    def enter(self, module: str, phase: str = "forward", thread: int = 1) -> None:
        seq = self._event("enter", phase, module, thread=thread)
        self.open.setdefault((module, thread), []).append(seq)

    def exit(self, module: str, phase: str = "forward", error: Optional[str] = None, thread: int = 1) -> None:
        seq = self._event("exit", phase, module, error=error, thread=thread)
        start = self.open[(module, thread)].pop()
        e = self.events[start]
        self.events[start] = e._replace(duration_ns=seq * 1000 - e.start_ns)

    def fire(
        self,
        hook: int,
        module: Optional[str] = "",
        phase: str = "forward",
        returned: bool = False,
        error: Optional[str] = None,
        thread: int = 1,
    ) -> int:
        return self._event("hook", phase, module, hook, self.kinds[hook], returned, error, thread)

    def call(
        self,
        module: str,
        pre: tuple[int, ...] = (),
        post: tuple[int, ...] = (),
        inner: Any = None,
        phase: str = "forward",
    ) -> None:
        self.enter(module, phase)
        for h in pre:
            self.fire(h, module, phase)
        if inner is not None:
            inner()
        for h in post:
            self.fire(h, module, phase)
        self.exit(module, phase)

    def trace(self, **meta: Any) -> Trace:
        return Trace(
            meta=Meta(torch="2.13", python="3.11", steps=self.step + 1, **meta),
            modules=self.modules,
            hooks=self.hooks,
            events=self.events,
            surprises=self.surprises,
        )


def plain(trace: Trace, **opts: Any) -> str:
    opts.setdefault("times", False)
    return tree_text(trace, width=100, **opts)


def lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def seqs_in_order(text: str) -> list[int]:
    """Hook seq numbers in the order they are printed (hook lines start with #N)."""
    return [int(m) for m in re.findall(r"(?:^|[─ ])#(\d+) ", text, flags=re.M)]


def two_layer() -> TraceBuilder:
    """Net(fc1, act, fc2): a global pre-hook, a prepended pre-hook, forward hooks; then backward."""
    b = TraceBuilder((("", "Net"), ("fc1", "Linear"), ("act", "ReLU"), ("fc2", "Linear")))
    g = b.hook("forward_pre", None, "global_pre")
    p = b.hook("forward_pre", "fc1", "early", prepend=True, prepend_source="registration")
    f1 = b.hook("forward", "fc1", "after_fc1", with_kwargs=True, always_call=True)
    f2 = b.hook("forward", "fc2", "after_fc2")
    bp = b.hook("backward_pre", "fc2", "grad_in_fc2")
    bw = b.hook("backward", "fc1", "grad_fc1")
    t = b.hook("grad", "fc1", "weight_grad", scope="tensor", tensor="fc1.weight")

    def body() -> None:
        b.call("fc1", pre=(g, p), post=(f1,))
        b.call("act", pre=(g,))
        b.call("fc2", pre=(g,), post=(f2,))

    b.call("", pre=(g,), inner=body)
    b.fire(bp, "fc2", "backward")
    b.fire(t, None, "backward")
    b.fire(bw, "fc1", "backward", returned=True)
    return b


LAYER_PARTS = (
    "self_attn",
    "self_attn.out_proj",
    "linear1",
    "dropout",
    "linear2",
    "norm1",
    "norm2",
    "dropout1",
    "dropout2",
)


def encoder(layers: int = 12, steps: int = 1, odd_layer: Optional[int] = None) -> TraceBuilder:
    """A TransformerEncoder-like trace: hooks on every module, a global pre-hook, backward hooks.

    `odd_layer`: that layer's linear1 forward hook returns a value (a different shape)."""
    b = TraceBuilder((("", "TransformerEncoder"), ("layers", "ModuleList")))
    paths = []
    for i in range(layers):
        b.add_module(f"layers.{i}", "TransformerEncoderLayer")
        paths.append(f"layers.{i}")
        for part in LAYER_PARTS:
            b.add_module(f"layers.{i}.{part}", "Linear" if "linear" in part or "proj" in part else "Module")
            paths.append(f"layers.{i}.{part}")
    g = b.hook("forward_pre", None, "log_inputs")
    own = {
        p: (
            b.hook("forward_pre", p, "pre"),
            b.hook("forward", p, "post"),
            b.hook("backward_pre", p, "bpre"),
            b.hook("backward", p, "bpost"),
        )
        for p in ["", *paths]
    }

    def run_layer(i: int) -> None:
        for part in LAYER_PARTS:
            p = f"layers.{i}.{part}"
            if part == "self_attn.out_proj":
                continue
            if part == "self_attn":
                b.enter(p)
                b.fire(g, p)
                b.fire(own[p][0], p)
                b.call(f"{p}.out_proj", pre=(g, own[f"{p}.out_proj"][0]), post=(own[f"{p}.out_proj"][1],))
                b.fire(own[p][1], p)
                b.exit(p)
            else:
                b.enter(p)
                b.fire(g, p)
                b.fire(own[p][0], p)
                b.fire(own[p][1], p, returned=(i == odd_layer and part == "linear1"))
                b.exit(p)

    for step in range(steps):
        b.step = step

        def body() -> None:
            for i in range(layers):
                p = f"layers.{i}"
                b.call(p, pre=(g, own[p][0]), post=(own[p][1],), inner=lambda i=i: run_layer(i))

        b.call("", pre=(g, own[""][0]), post=(own[""][1],), inner=body)
        b.fire(own[""][2], "", "backward")
        for i in reversed(range(layers)):
            p = f"layers.{i}"
            b.fire(own[p][2], p, "backward")
            for part in ("dropout2", "norm2", "dropout1", "norm1", "linear2", "dropout", "linear1"):
                b.fire(own[f"{p}.{part}"][2], f"{p}.{part}", "backward")
                b.fire(own[f"{p}.{part}"][3], f"{p}.{part}", "backward")
            for q in (f"{p}.self_attn", f"{p}.self_attn.out_proj"):
                b.fire(own[q][2], q, "backward")
            for q in (f"{p}.self_attn.out_proj", f"{p}.self_attn"):
                b.fire(own[q][3], q, "backward")
            b.fire(own[p][3], p, "backward")
        b.fire(own[""][3], "", "backward")
    return b


def hook_lines(text: str) -> list[tuple[int, str, str]]:
    """(seq, kind, name) of every hook line, in printed order."""
    return [(int(s), k, n) for s, k, n in re.findall(r"#(\d+) (\w+) +(\S+)", text) if k != "more"]


def indent_of(text: str, needle: str) -> int:
    line = next(line for line in text.splitlines() if needle in line)
    return line.index(needle)


# -- nesting, badges, errors -----------------------------------------------------------------------


def test_basic_golden(golden: Any) -> None:
    golden("tree/basic.txt", plain(two_layer().trace(target="model.py:make")))


def test_forward_nests_calls_and_lists_hooks_in_event_order() -> None:
    text = plain(two_layer().trace())
    seqs = [s for s, _, _ in hook_lines(text)]
    assert seqs == sorted(seqs) == [1, 3, 4, 5, 8, 11, 12, 15, 16, 17]
    assert indent_of(text, "fc1 Linear") > indent_of(text, "<root> Net")
    assert indent_of(text, "#4 forward_pre") > indent_of(text, "fc1 Linear")
    assert indent_of(text, "#1 forward_pre") == indent_of(text, "fc1 Linear")
    assert text.index("forward ") < text.index("backward ")


def test_badges_are_words_in_plain_text() -> None:
    text = plain(two_layer().trace())
    (early,) = lines_with(text, " early ")
    assert "[prepend]" in early and "[global]" not in early
    assert all("[global]" in line for line in lines_with(text, "global_pre"))
    assert len(lines_with(text, "global_pre")) == 4
    (after,) = lines_with(text, "after_fc1")
    assert "[with_kwargs, always_call]" in after and "model.py:" in after
    (grad,) = lines_with(text, "grad_fc1")
    assert "[returned]" in grad
    (weight,) = lines_with(text, "weight_grad")
    assert "on fc1.weight" in weight


def test_inferred_prepend_still_says_prepend() -> None:
    b = TraceBuilder((("", "Net"),))
    h = b.hook("forward_pre", "", "moved", prepend=True, prepend_source="inferred")
    b.call("", pre=(h,))
    (line,) = lines_with(plain(b.trace()), "moved")
    assert "prepend" in line and "inferred" in line


def test_errors_on_hooks_and_exit_events(golden: Any) -> None:
    b = TraceBuilder((("", "Net"), ("fc", "Linear")))
    bad = b.hook("forward", "fc", "explodes")
    cleanup = b.hook("forward", "fc", "cleanup", always_call=True)
    b.enter("")
    b.enter("fc")
    b.fire(bad, "fc", error="RuntimeError: boom")
    b.fire(cleanup, "fc")
    b.exit("fc", error="RuntimeError: boom")
    b.exit("", error="RuntimeError: boom")
    text = plain(b.trace())
    golden("tree/errors.txt", text)
    (line,) = lines_with(text, "explodes")
    assert "error]" in line and "error: RuntimeError: boom" in line
    (call,) = lines_with(text, "fc Linear")
    assert "raised RuntimeError: boom" in call
    assert "raised RuntimeError: boom" in lines_with(text, "<root> Net")[0]
    assert "[always_call]" in lines_with(text, "cleanup")[0]


def test_calls_without_hooks_are_pruned_unless_asked() -> None:
    b = TraceBuilder((("", "Net"), ("quiet", "ReLU"), ("loud", "Linear")))
    h = b.hook("forward", "loud", "noisy")
    b.call("", inner=lambda: (b.call("quiet"), b.call("loud", post=(h,))))
    assert "quiet" not in plain(b.trace())
    assert "quiet ReLU" in plain(b.trace(), show_empty=True)
    assert "3 module calls" in plain(b.trace())


def test_hooks_seen_before_enter_join_that_call() -> None:
    """A capture that records enter after the pre-hooks still gives one node per call."""
    b = TraceBuilder((("", "Net"), ("fc", "Linear")))
    pre = b.hook("forward_pre", "fc", "pre")
    post = b.hook("forward", "fc", "post")
    b.fire(pre, "fc")
    b.enter("fc")
    b.exit("fc")
    b.fire(post, "fc")
    text = plain(b.trace(), show_empty=True)
    assert len(lines_with(text, "fc Linear")) == 1
    assert indent_of(text, "#0 forward_pre") == indent_of(text, "#3 forward ") > indent_of(text, "fc Linear")


def test_unknown_hook_id_does_not_crash() -> None:
    b = TraceBuilder()
    b.enter("")
    b._event("hook", "forward", "", 999, "forward")
    b.exit("")
    assert "<unknown hook 999>" in plain(b.trace())


def test_threads_nest_separately() -> None:
    b = TraceBuilder((("", "Net"), ("a", "Linear"), ("b", "Linear")))
    ha = b.hook("forward", "a", "on_a")
    hb = b.hook("forward", "b", "on_b")
    b.enter("a", thread=1)
    b.enter("b", thread=2)
    b.fire(ha, "a", thread=1)
    b.fire(hb, "b", thread=2)
    b.exit("a", thread=1)
    b.exit("b", thread=2)
    text = plain(b.trace())
    assert indent_of(text, "a Linear") == indent_of(text, "b Linear")
    assert indent_of(text, "on_b") > indent_of(text, "b Linear")


# -- backward and recompute ---------------------------------------------------------------------------


def test_backward_groups_nest_under_open_ancestor() -> None:
    text = plain(encoder(2).trace(), expand=True)
    backward = text[text.index("backward ") :]
    assert indent_of(backward, "layers.1 Transformer") > indent_of(backward, "<root> Transformer")
    assert indent_of(backward, "layers.1.self_attn.out_proj") > indent_of(backward, "layers.1.self_attn ")
    seqs = [s for s, _, _ in hook_lines(backward)]
    assert seqs == sorted(seqs)


def test_tensor_hooks_without_module() -> None:
    b = TraceBuilder()
    t1 = b.hook("grad", None, "on_out", scope="tensor", tensor="output of block.fc")
    t2 = b.hook("post_accumulate_grad", None, "acc", scope="tensor", tensor="a tensor")
    b.fire(t1, None, "backward")
    b.fire(t2, None, "backward")
    text = plain(b.trace())
    assert indent_of(text, "#0 grad") == indent_of(text, "#1 post_accumulate_grad") == 8, "right in backward"
    assert "on output of block.fc" in text and "acc on a tensor" in text


def recompute_trace() -> Trace:
    """Checkpointed block: its forward hooks fire again during backward, and the recompute stops early."""
    b = TraceBuilder((("", "Net"), ("blk", "Block"), ("blk.fc", "Linear")))
    pre = b.hook("forward_pre", "blk.fc", "pre_fc")
    bwd = b.hook("backward", "blk.fc", "bwd_fc")
    b.call("", inner=lambda: b.call("blk", inner=lambda: b.call("blk.fc", pre=(pre,))))
    b.enter("blk", "recompute")
    b.call("blk.fc", pre=(pre,), phase="recompute")
    b.exit("blk", "recompute", error="_StopRecomputationError: ")
    b.fire(bwd, "blk.fc", "backward")
    return b.trace()


def test_recompute_is_its_own_phase_in_event_order(golden: Any) -> None:
    text = plain(recompute_trace())
    golden("tree/recompute.txt", text)
    # phases in the order they began: the recompute ran before the backward hook
    assert text.index("recompute (forward again during backward)") < text.index("backward ")
    recompute = text[text.index("recompute (") : text.index("backward ")]
    assert "stopped by PyTorch: _StopRecomputationError" in recompute and "raised" not in recompute
    assert [s for s, _, _ in hook_lines(recompute)] == [9]


def test_backward_skipped_shows_no_backward() -> None:
    b = TraceBuilder((("", "Net"),))
    h = b.hook("forward", "", "post")
    b.call("", post=(h,))
    text = plain(b.trace())
    assert "forward " in text and "backward" not in text


# -- collapse ------------------------------------------------------------------------------------


def test_identical_layers_collapse(golden: Any) -> None:
    text = plain(encoder(12).trace())
    golden("tree/encoder.txt", text)
    assert "×11 more with the same order (layers.1 … layers.11" in text
    assert "×11 more with the same order (layers.10 … layers.0" in text
    assert len(text.splitlines()) < 100  # about two screens
    assert "layers.5" not in text


def test_expand_shows_every_layer() -> None:
    text = plain(encoder(12).trace(), expand=True)
    assert "×" not in text
    assert len(lines_with(text, "TransformerEncoderLayer")) == 24
    assert len(hook_lines(text)) == 605


def test_one_different_hook_breaks_the_collapse() -> None:
    text = plain(encoder(12, odd_layer=5).trace())
    assert "×4 more with the same order (layers.1 … layers.4" in text
    assert "layers.5 TransformerEncoderLayer" in text
    assert "×5 more with the same order (layers.7 … layers.11" in text
    assert "[returned]" in text
    assert [s for s, _, _ in hook_lines(text)] == sorted(s for s, _, _ in hook_lines(text))


def test_different_hook_flags_break_the_collapse() -> None:
    b = TraceBuilder((("", "Seq"), ("0", "Linear"), ("1", "Linear"), ("2", "Linear")))
    hooks = [
        b.hook("forward", "0", "h"),
        b.hook("forward", "1", "h"),
        b.hook("forward", "2", "h", prepend=True),
    ]
    b.call("", inner=lambda: [b.call(str(i), post=(hooks[i],)) for i in range(3)])
    text = plain(b.trace())
    assert "×1 more with the same order (1," in text
    assert "2 Linear" in text and "[prepend]" in text


# -- filters -------------------------------------------------------------------------------------


def test_depth_limits_nesting(golden: Any) -> None:
    text = plain(encoder(2).trace(), depth=2)
    golden("tree/depth2.txt", text)
    assert "layers.0 TransformerEncoderLayer" in text
    assert "layers.0.linear1" not in text
    assert "… 9 calls deeper than depth 2 (27 hook calls)" in text
    assert "… 8 groups deeper than depth 2 (18 hook calls)" in text
    assert "<root>" not in plain(encoder(2).trace(), depth=0)
    with pytest.raises(ValueError):
        build_tree(encoder(1).trace(), depth=-1)


def test_module_filter_keeps_module_and_descendants() -> None:
    text = plain(encoder(3).trace(), module="layers.1.self_attn")
    assert "layers.1.self_attn Module" in text and "layers.1.self_attn.out_proj" in text
    assert "layers.0" not in text and "layers.1.linear1" not in text and "log_inputs" in text
    assert "31 module calls" in text and "shown: 10 hook calls, 2 module calls" in text
    # a path prefix that is not a module boundary does not match
    assert "layers.1" not in plain(encoder(12).trace(), module="layers.1").replace("layers.1 ", "").replace(
        "layers.1.", ""
    )


def test_phase_filter_and_bad_phase() -> None:
    text = plain(two_layer().trace(), phase="backward")
    assert "forward " not in text and "backward " in text
    assert [s for s, _, _ in hook_lines(text)] == [15, 16, 17]
    with pytest.raises(ValueError, match="unknown phase"):
        build_tree(two_layer().trace(), phase="sideways")


def test_filters_that_match_nothing_say_so() -> None:
    with pytest.raises(RenderError, match="no module 'nope' in this trace"):
        plain(two_layer().trace(), module="nope")
    with pytest.raises(RenderError, match="did you mean 'layers.3'"):
        plain(encoder(4).trace(), module="layer.3")
    with pytest.raises(RenderError, match="did you mean 'layers.3.self_attn'"):
        plain(encoder(4).trace(), module="3.self_attn")
    assert plain(two_layer().trace(), module="<root>") == plain(two_layer().trace(), module="")
    assert "No events for phase 'recompute'" in plain(two_layer().trace(), phase="recompute")
