#!/usr/bin/env python
"""hooktrace performance benchmarks: every row of the Performance table (issue 5), measured as it says.

    python benchmarks/run.py [--quick] [--json out.json] [--only ROW_ID ...]

Overhead rows are ratios of interleaved traced/untraced pairs in one process, on one thread; the
table shows min / median / max over the pairs and judges the median against the target. `--quick`
runs smaller sizes and fewer repeats (for the smoke test); its numbers are not the targets' numbers.
Memory rows run one subprocess per variant (this script with `--child`).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py and capture_rows.py beside it

from bytecodes import bench_bytecodes  # noqa: E402
from capture_rows import (  # noqa: E402
    _memory_child,
    bench_hook_heavy,
    bench_memory,
    bench_save_on_cpu,
    bench_shim,
    bench_transformer,
)
from common import Row, machine, not_measurable, table  # noqa: E402
from peers import bench_peers  # noqa: E402
from session_rows import _long_child, bench_empty, bench_long, bench_long_memory  # noqa: E402
from shapes_rows import bench_shapes  # noqa: E402


def synthetic_trace(n_events: int) -> Any:
    """A Trace shaped like a real one: 300 transformer-like module paths, 600 hooks, enter/hook/exit runs."""
    from hooktrace.schema import Event, Hook, Meta, Module, Trace

    subs = ("self_attn", "self_attn.out_proj", "linear1", "dropout", "linear2", "norm1", "norm2", "dropout1")
    paths = [""] + [f"layers.{i}.{sub}" for i in range(38) for sub in subs][:300]
    modules = [Module(p, "Linear" if p else "TransformerEncoder") for p in paths]
    hooks = [
        Hook(
            id=10 + i,
            kind=("forward_pre", "forward", "forward", "grad")[i % 4],
            scope="tensor" if i % 4 == 3 else "module",
            module=paths[1 + i // 4 % 300],
            name=f"hook_{i % 4}",
            defined_at=f"model.py:{10 + i % 4}",
            registered_at=f"model.py:{40 + i % 4}",
        )
        for i in range(600)
    ]
    tid = 140_245_819_283_264
    events = []
    t = 1_000_000
    for seq in range(n_events):
        r = seq % 6
        path = paths[1 + (seq // 6) % 300]
        t += 1_350
        if r == 0:
            ev = Event(seq, 0, "enter", "forward", path, None, None, tid, t, 41_000, False, None)
        elif r == 5:
            ev = Event(seq, 0, "exit", "forward", path, None, None, tid, t, 0, False, None)
        else:
            kind = ("forward_pre", "forward", "forward", "grad")[r - 1]
            phase = "backward" if kind == "grad" else "forward"
            ev = Event(
                seq, 0, "hook", phase, path, 10 + (seq // 6 % 150) * 4 + r - 1, kind, tid, t, 712, False, None
            )
        events.append(ev)
    return Trace(
        meta=Meta(torch="2.13.0", python="3.11.9", target="bench.py:make"),
        modules=modules,
        hooks=hooks,
        events=events,
    )


def bench_save_load(quick: bool, tmp: Path) -> list[Row]:
    """`save` + `load` of the synthetic trace against orjson dumping and loading the same events as
    rows of 12 values, interleaved pairs in this process (the order alternates). Wall time is the
    row; the CPU time of this process (user + system, less disturbed by other load on the machine)
    is a detail. What each side leaves is counted the same way: the timer stops with the result
    still alive (its deallocation is not timed on either side) and after the young-generation
    collection that the first allocation after it would run (load pauses the cyclic GC, so that
    collection is still to come when it returns). The orjson baseline runs as a caller would run
    it, GC on; the ratio against orjson run like `save`/`load` (GC paused, then that collection)
    is a detail too."""
    import orjson

    import hooktrace

    n = 50_000 if quick else 1_000_000
    pairs = 1 if quick else 7
    trace = synthetic_trace(n)
    rows = [list(e) for e in trace.events]
    path = tmp / "big.json"
    ratios, cpu_ratios, paused_ratios, saves, loads = [], [], [], [], []
    round_trip = ""

    def baseline(paused: bool) -> tuple[float, float]:
        gc.collect()
        if paused:
            gc.disable()
        w0, c0 = time.perf_counter(), time.process_time()
        out = orjson.loads(orjson.dumps(rows))
        gc.enable()
        gc.collect(0)
        w1, c1 = time.perf_counter(), time.process_time()
        del out
        return w1 - w0, c1 - c0

    def ours() -> tuple[float, float]:
        nonlocal round_trip
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        trace.save(path)
        w1 = time.perf_counter()
        loaded = hooktrace.load(path)
        gc.collect(0)
        w2, c2 = time.perf_counter(), time.process_time()
        saves.append(w1 - w0)
        loads.append(w2 - w1)
        if not round_trip:
            same = loaded.events == trace.events and loaded.to_dict() == trace.to_dict()
            round_trip = "exact" if same else "DIFFERS"
        del loaded
        return w2 - w0, c2 - c0

    for i in range(pairs):
        if i % 2:
            (w, c), (bw, bc) = ours(), baseline(False)
        else:
            (bw, bc), (w, c) = baseline(False), ours()
        ratios.append(w / bw)
        cpu_ratios.append(c / bc)
        paused_ratios.append(w / baseline(True)[0])
    size = path.stat().st_size
    version = orjson.loads(path.read_bytes())["version"]
    trace.save(tmp / "big.json.gz")
    gz_size = (tmp / "big.json.gz").stat().st_size
    path.unlink()
    (tmp / "big.json.gz").unlink()
    return [
        Row(
            "save_load",
            f"save + load of a {n:,}-event trace (version {version} in the file) / orjson dumps + loads of "
            "the same rows",
            "x",
            1.0,
            ratios,
            note="" if round_trip == "exact" else "the loaded trace differs from the saved one",
            details={
                "events": n,
                "round_trip": round_trip,
                "save_s": statistics.median(saves),
                "load_s": statistics.median(loads),
                "cpu_ratio": statistics.median(cpu_ratios),
                "cpu_ratios": " ".join(f"{r:.2f}" for r in cpu_ratios),
                "wall_ratios": " ".join(f"{r:.2f}" for r in ratios),
                "ratio_to_gc_paused_orjson": statistics.median(paused_ratios),
            },
        ),
        Row(
            "file_size",
            f"trace file size per event, {n:,} events, version {version}",
            "B/event",
            60.0,
            [size / n],
            details={"MB": size / 1e6, "gzip_MB": gz_size / 1e6},
        ),
    ]


def _small_trace(path: Path) -> None:
    import torch
    from torch import nn

    import hooktrace

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].register_forward_hook(lambda m, a, o: None)
    with hooktrace.trace(model) as session:
        model(torch.randn(2, 4)).sum().backward()
    session.save(str(path))


def _time_cmd(cmd: list[str]) -> tuple[float, int, str]:
    """Wall time, exit code and the last stderr line (a Python traceback means the command is broken)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    crashed = "Traceback (most recent call last)" in proc.stderr
    return seconds, proc.returncode, proc.stderr.strip().splitlines()[-1] if crashed else ""


_IMPORTS_TORCH = (
    "import sys\nfrom hooktrace.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
    "sys.__stderr__.write('HOOKTRACE_TORCH=%d' % ('torch' in sys.modules))\n"
)


def _imports_torch(args: list[str]) -> Optional[bool]:
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_TORCH, *args], capture_output=True, text=True)
    marker = proc.stderr.rsplit("HOOKTRACE_TORCH=", 1)
    return marker[1].strip() == "1" if len(marker) == 2 else None


def bench_cli(quick: bool, tmp: Path) -> list[Row]:
    runs = 1 if quick else 5
    a, b = tmp / "a.json", tmp / "b.json"
    _small_trace(a)
    _small_trace(b)
    exe = shutil.which("hooktrace")
    prefix = [exe] if exe else [sys.executable, "-m", "hooktrace"]
    commands = {
        "cli_help": ["--help"],
        "cli_render": ["render", str(a)],
        "cli_diff": ["diff", str(a), str(b)],
        "cli_exec_help": ["exec", "--help"],
    }
    rows = {
        key: Row(key, f"`hooktrace {args[0]}` start-up / `python -c 'import torch'`", "ratio", 0.15)
        for key, args in commands.items()
    }
    try:
        import hooktrace.cli  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (a broken CLI is a finding, not a crash of the benchmark)
        return [not_measurable(r, f"hooktrace.cli does not import: {exc}") for r in rows.values()]
    torch_times: list[float] = []
    cmd_times: dict[str, list[float]] = {key: [] for key in commands}
    codes: dict[str, set[int]] = {key: set() for key in commands}
    crashes: dict[str, str] = {}
    for _ in range(runs):  # interleaved, so drift hits every command alike
        torch_times.append(_time_cmd([sys.executable, "-c", "import torch"])[0])
        for key, args in commands.items():
            seconds, code, crash = _time_cmd(prefix + args)
            cmd_times[key].append(seconds)
            codes[key].add(code)
            if crash:
                crashes[key] = crash
    torch_s = statistics.median(torch_times)
    for key, args in commands.items():
        row = rows[key]
        bad = codes[key] - {0, 1}
        if bad or key in crashes:
            not_measurable(row, f"the command fails: exit {sorted(codes[key])}, {crashes.get(key, '')}")
            continue
        row.values = [s / torch_s for s in cmd_times[key]]
        row.details = {
            "median_s": statistics.median(cmd_times[key]),
            "import_torch_s": torch_s,
            "imports_torch": _imports_torch(args),
            "exit_codes": sorted(codes[key]),
        }
    return list(rows.values())


# -- exec: the steps outside the window ---------------------------------------------------------------
EXEC_SCRIPT = Path(__file__).resolve().parent / "exec_script.py"
# outside the window: step 0 is warm-up; step 9's timed region ends with the optimizer.step() that
# opens the window (the capture's install runs inside it), 10 and 11 are traced (11 ends by closing it)
UNTRACED = [*range(1, 9), *range(12, 20)]
OPENS = 9


def bench_exec(quick: bool, tmp: Path) -> list[Row]:
    """Pairs of processes, interleaved: `python exec_script.py` and `hooktrace exec --start 10 --steps 2
    --keep-running exec_script.py`; per pair, the untraced steps' summed time traced / plain."""
    row = Row(
        "exec_untraced_steps",
        "`hooktrace exec --start 10 --steps 2`: CPU time of the 16 steps outside the window / the same steps under plain python",
        "ratio",
        1.02,
    )
    exe = shutil.which("hooktrace")
    prefix = [exe] if exe else [sys.executable, "-m", "hooktrace"]
    plain_cmd = [sys.executable, str(EXEC_SCRIPT)]
    traced_cmd = [
        *prefix,
        "exec",
        "--start",
        "10",
        "--steps",
        "2",
        "--keep-running",
        "-o",
        str(tmp / "e.json"),
    ]
    traced_cmd.append(str(EXEC_SCRIPT))
    ratios, wall_ratios, plain_ms, window_ms = [], [], [], []
    for i in range(2 if quick else 6):
        sums: dict[str, tuple[float, float]] = {}
        for kind in ("plain", "traced") if i % 2 == 0 else ("traced", "plain"):
            out = tmp / f"{kind}.json"
            cmd = plain_cmd if kind == "plain" else traced_cmd
            proc = subprocess.run([*cmd, str(out)], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                return [not_measurable(row, f"{kind} run failed: {proc.stderr.strip()[-300:]}")]
            times = json.loads(out.read_text())
            cpu, wall = times["cpu"], times["wall"]
            sums[kind] = (sum(cpu[s] for s in UNTRACED), sum(wall[s] for s in UNTRACED))
            if kind == "traced":
                window_ms.append(1000 * (cpu[10] + cpu[11]) / 2)
            else:
                plain_ms.append(1000 * sums[kind][0] / len(UNTRACED))
        ratios.append(sums["traced"][0] / sums["plain"][0])
        wall_ratios.append(sums["traced"][1] / sums["plain"][1])
    row.values = ratios
    row.details = {
        "plain_step_cpu_ms": statistics.median(plain_ms),
        "window_step_cpu_ms": statistics.median(window_ms),
        "wall_ratio_median": statistics.median(wall_ratios),
        "wall_ratios": wall_ratios,
        "steps_compared": UNTRACED,
    }
    return [row]


def bench_exec_in_process(quick: bool, tmp: Path) -> list[Row]:
    """The same script in this one process (no difference of start-up, imports or heap between the
    sides): `runpy.run_path` as python runs it, and `run_script` as `hooktrace exec --start 10 --steps 2
    --keep-running` runs it, interleaved (the order alternates, `gc.collect()` before each run)."""
    import runpy

    from hooktrace.runs.script import ExecOptions, Script, run_script

    row = Row(
        "exec_untraced_in_process",
        "the same, both sides in this process: `run_script` (exec's window and watchers) / `runpy.run_path`",
        "ratio",
        1.02,
    )
    options = ExecOptions(start=10, steps=2, keep_running=True)

    def run(kind: str, out: Path, *extra: str) -> Optional[str]:
        """One run of the script, as python or as exec runs it; why it failed, or None."""
        if kind == "plain":
            argv = sys.argv
            sys.argv = [str(EXEC_SCRIPT), str(out), *extra]
            try:
                runpy.run_path(str(EXEC_SCRIPT), run_name="__main__")
            finally:
                sys.argv = argv
            return None
        result = run_script(Script(path=str(EXEC_SCRIPT), args=(str(out), *extra)), options, lambda r: None)
        return (
            None if result.exit_code == 0 and result.exception is None else f"exec run failed: {result.error}"
        )

    counts = {}
    for kind in ("plain", "traced"):  # what runs in Python per step: the same on any machine
        failed = run(kind, tmp / f"count-{kind}.json", "count")
        if failed:
            return [not_measurable(row, failed)]
        counts[kind] = json.loads((tmp / f"count-{kind}.json").read_text())
    ratios, wall_ratios, plain_ms, open_ms = [], [], [], []
    for i in range(3 if quick else 12):
        sums: dict[str, tuple[float, float]] = {}
        for kind in ("plain", "traced") if i % 2 == 0 else ("traced", "plain"):
            out = tmp / f"in-process-{kind}.json"
            gc.collect()
            failed = run(kind, out)
            if failed:
                return [not_measurable(row, failed)]
            times = json.loads(out.read_text())
            cpu, wall = times["cpu"], times["wall"]
            sums[kind] = (sum(cpu[s] for s in UNTRACED), sum(wall[s] for s in UNTRACED), cpu[OPENS])
            if kind == "plain":
                plain_ms.append(1000 * sums[kind][0] / len(UNTRACED))
        ratios.append(sums["traced"][0] / sums["plain"][0])
        wall_ratios.append(sums["traced"][1] / sums["plain"][1])
        open_ms.append(1000 * (sums["traced"][2] - sums["plain"][2]))
    before, after = UNTRACED[:8], UNTRACED[8:]
    row.values = ratios
    row.details = {
        "python_calls_per_step": {
            "plain": counts["plain"]["calls"][before[0]],
            "exec_before_window": counts["traced"]["calls"][before[0]],
            "exec_after_window": counts["traced"]["calls"][after[0]],
        },
        "bytecodes_per_step": {
            "plain": counts["plain"]["opcodes"][before[0]],
            "exec_before_window": counts["traced"]["opcodes"][before[0]],
            "exec_after_window": counts["traced"]["opcodes"][after[0]],
        },
        "window_opening_cpu_ms": statistics.median(open_ms),
        "plain_step_cpu_ms": statistics.median(plain_ms),
        "wall_ratio_median": statistics.median(wall_ratios),
        "wall_ratios": wall_ratios,
        "steps_compared": UNTRACED,
    }
    return [row]


# -- row 7: tree / SVG render of a 24-layer transformer ------------------------------------------------
def transformer_trace(layers: int) -> Any:
    """One fwd+bwd of TransformerEncoder(`layers`, 256, 8 heads); pre, forward, full backward hooks."""
    import warnings

    import torch
    from torch import nn

    import hooktrace

    torch.manual_seed(0)
    model = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(256, 8, batch_first=True), layers, enable_nested_tensor=False
    )
    for module in model.modules():
        module.register_forward_pre_hook(lambda m, a: None)
        module.register_forward_hook(lambda m, a, o: None)
        module.register_full_backward_hook(lambda m, gi, go: None)
    x = torch.randn(4, 64, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(model) as session:
            model(x).sum().backward()
    return session.trace


def bench_render(quick: bool) -> list[Row]:
    layers = 4 if quick else 24
    repeats = 1 if quick else 3
    rows = [
        Row("render_tree", f"tree render of a {layers}-layer TransformerEncoder trace", "s", 1.0),
        Row("render_svg", f"SVG render of a {layers}-layer TransformerEncoder trace", "s", 10.0),
    ]
    try:
        from hooktrace.render import render
    except ImportError as exc:
        return [not_measurable(r, f"hooktrace.render.render does not exist yet ({exc})") for r in rows]
    trace = transformer_trace(layers)
    for row, fmt in zip(rows, ("tree", "svg")):
        row.details = {"events": len(trace.events), "hooks": len(trace.hooks)}
        try:
            for _ in range(repeats):
                gc.collect()
                t0 = time.perf_counter()
                out = render(trace, fmt)
                row.values.append(time.perf_counter() - t0)
            row.details["output_chars"] = len(out)
        except Exception as exc:  # noqa: BLE001
            not_measurable(row, f"render(trace, {fmt!r}) raised {type(exc).__name__}: {exc}")
    return rows


# -- table ------------------------------------------------------------------------------------------
BENCHES: dict[str, Callable[..., list[Row]]] = {
    "hook_heavy": bench_hook_heavy,
    "transformer": bench_transformer,
    "save_on_cpu": bench_save_on_cpu,
    "shim": bench_shim,
    "memory": bench_memory,
    "save_load": bench_save_load,
    "cli": bench_cli,
    "render": bench_render,
    "exec": bench_exec,
    "exec_in_process": bench_exec_in_process,
    "shapes": bench_shapes,
    "peers": bench_peers,
    "bytecodes": bench_bytecodes,
    "empty": bench_empty,
    "long": bench_long,
    "long_memory": bench_long_memory,
}
NEEDS_TMP = {"save_load", "cli", "exec", "exec_in_process"}
GROUPS = {
    "hook_heavy": ("hook_heavy_step", "hook_heavy_session"),
    "transformer": ("transformer_step", "transformer_session"),
    "save_on_cpu": ("save_on_cpu_step", "save_on_cpu_session"),
    "shim": ("shim_overhead",),
    "memory": ("memory_per_event",),
    "save_load": ("save_load", "file_size"),
    "cli": ("cli_help", "cli_render", "cli_diff", "cli_exec_help"),
    "render": ("render_tree", "render_svg"),
    "exec": ("exec_untraced_steps",),
    "exec_in_process": ("exec_untraced_in_process",),
    "shapes": ("shapes_shim", "hook_heavy_shapes", "transformer_shapes"),
    "peers": ("hook_heavy_peers", "transformer_peers"),
    "bytecodes": ("hook_heavy_bytecodes", "transformer_bytecodes"),
    "empty": ("empty_session_10", "empty_session_1000"),
    "long": ("hook_heavy_long_window",),
    "long_memory": ("memory_per_event_long",),
}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (smoke test)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="run only these groups")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "CALLS", "MEASURE"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--long-child", nargs=3, metavar=("VARIANT", "STEPS", "MEASURE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_memory_child(args.child[0], int(args.child[1]), args.child[2])))
        return 0
    if args.long_child:
        print(json.dumps(_long_child(args.long_child[0], int(args.long_child[1]), args.long_child[2])))
        return 0

    import torch

    torch.set_num_threads(1)
    info = machine()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hooktrace-bench-") as tmp:
        for name, bench in BENCHES.items():
            if args.only and name not in args.only:
                continue
            t0 = time.perf_counter()
            try:
                rows.extend(bench(args.quick, Path(tmp)) if name in NEEDS_TMP else bench(args.quick))
            except Exception as exc:  # noqa: BLE001  (one broken group must not hide the others)
                reason = f"benchmark raised {type(exc).__name__}: {exc}"
                rows.extend(
                    not_measurable(Row(row_id, name, "", math.nan), reason) for row_id in GROUPS[name]
                )
            print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    print(table(rows, info))
    if args.json:
        args.json.write_text(
            json.dumps({"machine": info, "quick": args.quick, "rows": [r.as_json() for r in rows]}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
