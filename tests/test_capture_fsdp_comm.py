"""FSDP's communication hooks (capture/fsdp.py): FSDP2's `set_all_reduce_hook`, `set_custom_all_gather`,
`set_custom_reduce_scatter` and FSDP1's `register_comm_hook`, each a kind of its own.

Real FSDP on CPU: a one-rank gloo group here, two ranks through torchrun for the custom collectives
(FSDP2 runs no all-gather or reduce-scatter on one rank). Each hook records its own name as it runs
(and whether autograd's engine was running); hooktrace's events must be that record, in that order,
with the FSDP module and the phase; traced and untraced give the same record and gradients, and
what FSDP holds is the user's own object inside the block and after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace

pytest.importorskip("torch.distributed.fsdp")
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from .fsdp_comms import (  # noqa: E402
    CUSTOM_COMMS,
    FSDP_KINDS,
    NO_CUSTOM_COMMS,
    AllGather,
    ReduceScatter,
    fsdp_events,
    named,
)

HERE = "tests/test_capture_fsdp_comm.py"


def _groups(module: Any) -> list[Any]:
    """The module's FSDP2 param groups: a list on torch 2.12 on, one group (or None) on 2.9 to 2.11."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        groups = [g for g in (state._fsdp_param_group,) if g is not None]
    return list(groups)


def _held(module: Any) -> list[tuple[Any, Any, Any]]:
    """What the module's FSDP2 param groups hold."""
    return [
        (g._all_reduce_hook, getattr(g, "_all_gather_comm", None), getattr(g, "_reduce_scatter_comm", None))
        for g in _groups(module)
    ]  # no custom comms before torch 2.9


def _fsdp2(traced: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    log: list[str] = []
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    fully_shard(m[0])
    fully_shard(m)
    before = named(log, "ar_block")
    m[0].set_all_reduce_hook(before)  # before the block
    ar_root, ag, rs = named(log, "ar_root"), AllGather(log, "ag"), ReduceScatter(log, "rs")
    x = torch.randn(3, 4)
    inside: list[Any] = []
    with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
        m.set_all_reduce_hook(ar_root)
        if CUSTOM_COMMS:
            m.set_custom_all_gather(ag)
            m.set_custom_reduce_scatter(rs)
        for step in range(2):
            if step and traced:
                t.mark_step()
            m(x).sum().backward()
            inside += [_held(m), _held(m[0])]
    return {
        "log": log,
        "allocations": (ag.allocations, rs.allocations),
        "grads": [p.grad.full_tensor() for p in m.parameters()],
        "inside": inside,
        "after": [_held(m), _held(m[0])],
        "users": (ar_root, ag, rs, before),
        "trace": t.trace if traced else None,
    }


def test_fsdp2_all_reduce_hooks_are_their_own_kind_in_the_order_they_ran(gloo_one_rank: None) -> None:
    plain, traced = _fsdp2(False), _fsdp2(True)
    assert plain["log"] == traced["log"]
    # on one rank FSDP2 runs no collective from torch 2.10; 2.9 still runs its reduce-scatter there
    # (the root's custom one: m[0] keeps the default), before the root's all-reduce hook
    scatters = "rs" in plain["log"]
    assert scatters == (CUSTOM_COMMS and torch.torch_version.TorchVersion(torch.__version__) < "2.10")
    assert plain["log"] == (["rs", "ar_root", "ar_block"] if scatters else ["ar_root", "ar_block"]) * 2
    assert plain["allocations"] == traced["allocations"]  # a custom comm's allocate is its own
    for a, b in zip(plain["grads"], traced["grads"]):
        assert torch.equal(a, b)
    trace = traced["trace"]
    events = fsdp_events(trace)
    alias = {"ReduceScatter": "rs"}  # a comm object is named by its class
    assert [alias.get(name, name) for name, *_ in events] == traced["log"]
    assert {(name, kind, phase, module) for name, kind, phase, module in events} == {
        ("ar_root", "fsdp_all_reduce", "backward", ""),
        ("ar_block", "fsdp_all_reduce", "backward", "0"),
    } | ({("ReduceScatter", "fsdp_reduce_scatter", "backward", "")} if scatters else set())
    per_step = len(traced["log"]) // 2
    assert [e.step for e in trace.hook_events() if e.kind in FSDP_KINDS] == [0] * per_step + [1] * per_step
    hooks = {h.name: h for h in trace.hooks if h.kind in FSDP_KINDS}
    assert hooks["ar_root"].registered_at.startswith(HERE) and hooks["ar_root"].module == ""
    assert hooks["ar_block"].registered_at is None and hooks["ar_block"].module == "0"
    assert hooks["ar_root"].defined_at.startswith("tests/fsdp_comms.py")
    assert {name: h.kind for name, h in hooks.items() if name in ("AllGather", "ReduceScatter")} == (
        {"AllGather": "fsdp_all_gather", "ReduceScatter": "fsdp_reduce_scatter"} if CUSTOM_COMMS else {}
    )
    # what FSDP holds is the user's own, inside the block and after it
    ar_root, ag, rs, before = traced["users"]
    if not CUSTOM_COMMS:
        ag = rs = None  # type: ignore[assignment]
    for root, block in zip(traced["inside"][::2], traced["inside"][1::2]):
        assert root == [(ar_root, ag, rs)] and block[0][0] is before
    assert traced["after"][0] == [(ar_root, ag, rs)] and traced["after"][1][0][0] is before
    if not CUSTOM_COMMS:
        return
    # one rank: FSDP2 runs no all-gather (nor, from 2.10, a reduce-scatter), so the custom ones are
    # never called, and the trace says why
    for comm in ("AllGather",) if scatters else ("AllGather", "ReduceScatter"):
        [never] = [s for s in trace.surprises if s.rule == "never-fired" and hooks[comm].id in s.hooks]
        assert "more than one rank" in never.message and never.level == "warn"
    # where the trace knows the group has one rank (`run`, a rank under torchrun), that is the reason
    from hooktrace.analysis.never_fired import never_fired

    trace.meta.world_size = 1
    said = [s for s in never_fired(trace) if hooks["AllGather"].id in s.hooks]
    assert (
        said[0].level == "info" and "on a one-rank process group FSDP2 runs no all-gather" in said[0].message
    )


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")  # one rank
def test_fsdp1_comm_hook_fires_once_per_fsdp_unit_on_its_module(gloo_one_rank: None) -> None:
    def run(traced: bool, registered_inside: bool) -> tuple[list[str], Any, list[Any], Any]:
        torch.manual_seed(0)
        log: list[str] = []
        cpu = torch.device("cpu")
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        m[0] = FSDP(m[0], device_id=cpu)
        m = FSDP(m, device_id=cpu)

        def comm_hook(state: Any, grad: torch.Tensor) -> None:  # NO_SHARD's signature (one rank)
            log.append(f"comm {grad.numel()}")
            torch.distributed.all_reduce(grad)

        if not registered_inside:
            m.register_comm_hook(None, comm_hook)
        with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
            if registered_inside:
                m.register_comm_hook(None, comm_hook)
            held = [u._comm_hook for u in FSDP.fsdp_modules(m)]
            m(torch.randn(2, 4)).sum().backward()
        assert held == [comm_hook] * 2 == [u._comm_hook for u in FSDP.fsdp_modules(m)]
        return log, t.trace if traced else None, [p.grad for p in m.parameters()], comm_hook

    for inside in (True, False):
        plain, _, plain_grads, _ = run(False, inside)
        log, trace, grads, hook = run(True, inside)
        assert log == plain == ["comm 20", "comm 5"]  # the inner unit (4x4 + 4), then the root (4 + 1)
        for a, b in zip(plain_grads, grads):
            assert torch.equal(a, b)
        events = fsdp_events(trace)
        assert [(kind, phase, module) for _, kind, phase, module in events] == [
            ("fsdp_comm", "backward", "_fsdp_wrapped_module.0"),
            ("fsdp_comm", "backward", ""),
        ]
        hooks = [h for h in trace.hooks if h.kind == "fsdp_comm"]
        assert {h.name for h in hooks} == {hook.__qualname__}
        assert all((h.registered_at or "").startswith(HERE) == inside for h in hooks)
        assert not [
            s for s in trace.surprises if s.rule == "never-fired" and set(s.hooks) & {h.id for h in hooks}
        ]


def test_after_the_block_fsdp_calls_its_hooks_itself(gloo_one_rank: None) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    patched = (_fsdp_param_group.foreach_reduce, _fsdp_param_group.foreach_all_gather)
    setter = vars(FSDPModule)["set_all_reduce_hook"]
    log: list[str] = []
    m = nn.Linear(4, 2)
    fully_shard(m)
    with hooktrace.trace(m):
        m.set_all_reduce_hook(named(log, "ar"))
        assert _fsdp_param_group.foreach_reduce is not patched[0]  # traced: the test can fail
    assert (_fsdp_param_group.foreach_reduce, _fsdp_param_group.foreach_all_gather) == patched
    assert vars(FSDPModule)["set_all_reduce_hook"] is setter
    m(torch.randn(2, 4)).sum().backward()
    assert log == ["ar"]


def test_the_hooks_fsdp_holds_at_the_end_are_listed_as_registered(gloo_one_rank: None) -> None:
    """`hooktrace hooks` lists what FSDP will call: the hook a setter replaced is not among them."""
    from hooktrace.analysis.listing import firing_order

    log: list[str] = []
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    fully_shard(m[0])
    fully_shard(m)
    first, second = named(log, "first"), named(log, "second")
    with hooktrace.trace(m) as t:
        m.set_all_reduce_hook(first)
        m[0].set_all_reduce_hook(first)
        m.set_all_reduce_hook(second)  # FSDP holds `second` on the root from now on
    rows = [(r.module, [h.name for h in r.hooks]) for r in firing_order(t.trace, t.held_ids)]
    assert [row for row in rows if row[1][0] in ("first", "second")] == [("", ["second"]), ("0", ["first"])]
    assert _groups(m)[0]._all_reduce_hook is second
    assert log == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not CUSTOM_COMMS, reason=NO_CUSTOM_COMMS)
def test_fsdp2_custom_collectives_on_two_ranks(tmp_path: Path) -> None:
    """Two gloo ranks: the custom all-gather (forward, and backward's re-gather) and reduce-scatter
    run, with the all-reduce hooks; each rank's events are its hooks' own record."""
    script = Path(__file__).parent / "fsdp_comms.py"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
         str(_free_port()), str(script), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        result: dict[str, Any] = json.loads((tmp_path / f"rank{rank}.json").read_text())
        plain, traced = result["plain"], result["traced"]
        assert plain["log"] == traced["log"] and plain["grads"] == traced["grads"]
        log = [tuple(entry) for entry in traced["log"]]
        names = [name for name, _ in log]
        assert names.count("ag") == 6 and names.count("rs") == 4 and names.count("ar_root") == 2
        phases = {"ag": None, "rs": "backward", "ar_root": "backward", "ar_block": "backward"}
        alias = {"AllGather": "ag", "ReduceScatter": "rs"}  # a comm object is named by its class
        events = [(alias.get(name, name), *rest) for name, *rest in traced["events"]]
        # the hooks' own record: name, and whether autograd's engine ran them
        assert [(name, phase == "backward") for name, _kind, phase, _m in events] == log
        for name, kind, phase, module in events:
            assert phases[name] in (None, phase)
            assert kind == {"ag": "fsdp_all_gather", "rs": "fsdp_reduce_scatter"}.get(name, "fsdp_all_reduce")
            assert module in ("", "0")
        assert {phase for name, _k, phase, _m in events if name == "ag"} == {"forward", "backward"}
        assert not traced["never_fired"]


@pytest.mark.parametrize("start", ["0", "1"])
def test_exec_traces_fsdp_imported_by_the_script(tmp_path: Path, start: str) -> None:
    """`hooktrace exec` opens its capture before the script imports FSDP (window at step 0), or after
    (step 1): the all-reduce hooks' calls in the window are the hooks' own record of that step."""
    out = tmp_path / "trace.json"
    env = {**os.environ, "MASTER_PORT": str(_free_port())}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    script = Path(__file__).parent / "scripts" / "fsdp_exec.py"
    args = ["exec", "--start", start, "--keep-running", "-o", str(out), str(script)]
    done = subprocess.run([sys.executable, "-m", "hooktrace", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    own = [line for line in done.stderr.splitlines() if line.startswith("all_reduce_hook step")]
    trace = hooktrace.load(str(out))
    events = [e for e in trace.hook_events() if e.kind == "fsdp_all_reduce"]
    assert [f"{trace.hook(e.hook).name} step {start}" for e in events] == [
        line for line in own if line.endswith(f"step {start}")
    ]
    assert [e.module for e in events] == ["", "0"] and len(own) == 4
    lines = script.read_text().splitlines()
    setters = {f"fsdp_exec.py:{n}" for n, line in enumerate(lines, 1) if ".set_all_reduce_hook(" in line}
    registered = {(trace.hook(e.hook).registered_at or "").rsplit("/", 1)[-1] for e in events}
    # seen by the capture (window at step 0), or by exec's registration watch before a later window
    assert registered == setters


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")  # one rank
@pytest.mark.parametrize("version", ["fsdp2", "fsdp1"])
def test_the_registration_watch_tells_where_fsdp_hooks_were_set_before_the_window(
    gloo_one_rank: None, version: str
) -> None:
    """`hooktrace exec` and `run --warmup` watch registrations before the window opens (nothing
    wrapped but the registration calls): FSDP's setters among them, so a hook set then has its call
    site in the trace, and its calls in the window are its own record. Without the watch (a hook set
    before a `hooktrace.trace()` block) there is no call site: the nearest case."""
    from hooktrace.capture.session import TraceSession
    from hooktrace.capture.steps import Registrations, open_after

    def run(watched: bool) -> tuple[list[str], Any]:
        torch.manual_seed(0)
        log: list[str] = []
        registrations = Registrations()
        if watched:
            registrations.install()  # before FSDP wraps the model, as exec does from the script's start
        try:
            m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
            if version == "fsdp2":
                fully_shard(m[0])
                fully_shard(m)
                m.set_all_reduce_hook(named(log, "set_here"))
            else:
                cpu = torch.device("cpu")
                m[0] = FSDP(m[0], device_id=cpu)
                m = FSDP(m, device_id=cpu)
                m.register_comm_hook(None, lambda state, grad: log.append("set_here"))
            session = TraceSession(m)
            if watched:
                open_after(registrations, session)
            else:
                session.__enter__()
            try:
                m(torch.randn(3, 4)).sum().backward()
            finally:
                session.__exit__(None, None, None)
        finally:
            registrations.restore()
        return log, session.trace

    lines = Path(__file__).read_text().splitlines()
    setter = ".set_all_reduce_hook(" if version == "fsdp2" else ".register_comm_hook(None"
    [line] = [n for n, text in enumerate(lines, 1) if f"m{setter}" in text and "set_here" in text]
    for watched in (True, False):
        log, trace = run(watched)
        events = [e for e in trace.hook_events() if e.kind in FSDP_KINDS]
        assert len(events) == len(log) > 0
        sites = {trace.hook(e.hook).registered_at for e in events}
        assert sites == ({f"{HERE}:{line}"} if watched else {None})
