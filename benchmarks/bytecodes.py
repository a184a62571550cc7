#!/usr/bin/env python
"""Python bytecodes of one whole one-step session, phase by phase, beside ModuleTracker (issue 34).

    python benchmarks/bytecodes.py [open|step|end|build|all] [hook_heavy|transformer]

Counts `sys.settrace` opcode events: the Python work a phase does, the same on any machine and at
any load (timings on a shared machine are not). A session is the `peers` rows' (benchmarks/peers.py):
`with hooktrace.trace(model) as t:` around one training step, then `t.trace` built. Phases: `open`
(`__enter__`), `step` (the traced step), `end` (`__exit__`), `build` (`t.trace`: events, hooks, the
surprises' analysis); beside them ModuleTracker's whole step and the untraced step. Three sessions
run first (what the process keeps between sessions is then kept, as in the peers rows' rounds).
C code (torch's kernels, the interpreter's builtins) is not counted: these are not times.

With a phase, prints the functions that ran most bytecodes in it, then every phase's count.
The `bytecodes` rows of run.py report hooktrace's whole session against ModuleTracker's step.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row  # noqa: E402
from peers import hook_heavy_training, training_step, transformer_training  # noqa: E402

PHASES = ("open", "step", "end", "build")


def counted(fn: Callable[[], Any], where: Counter) -> Any:
    """Run `fn`, adding each opcode it runs to `where` under (file, function, first line)."""

    def tracer(frame: Any, _event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        code = frame.f_code
        key = (code.co_filename.split("/hooktrace/")[-1], code.co_name, code.co_firstlineno)

        def local(_frame: Any, event: str, _arg: Any) -> Any:
            if event == "opcode":
                where[key] += 1
            return local

        return local

    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(None)


def session(model: Any, x: Any) -> dict[str, Counter]:
    """Counters of one session's phases, ModuleTracker's step and the untraced step."""
    import torch
    from torch.utils.module_tracker import ModuleTracker

    import hooktrace

    torch.set_num_threads(1)
    step = training_step(model, x, "cpu")
    for _ in range(3):
        with hooktrace.trace(model) as warm:
            step()
        warm.trace  # noqa: B018 - built at first use
    out = {name: Counter() for name in (*PHASES, "module_tracker", "untraced")}
    block = hooktrace.trace(model)
    opened = counted(block.__enter__, out["open"])
    counted(step, out["step"])
    counted(lambda: block.__exit__(None, None, None), out["end"])
    counted(lambda: opened.trace, out["build"])

    def tracked() -> None:
        with ModuleTracker():
            step()

    counted(tracked, out["module_tracker"])
    counted(step, out["untraced"])
    return out


MODELS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "hook_heavy": hook_heavy_training,
    "transformer": transformer_training,
}


def totals(counts: dict[str, Counter]) -> dict[str, int]:
    out = {name: sum(c.values()) for name, c in counts.items()}
    out["session"] = sum(out[p] for p in PHASES)
    return out


def bench_bytecodes(quick: bool) -> list[Row]:
    """One row per model: hooktrace's whole session in bytecodes; target, ModuleTracker's step."""
    rows = []
    for name, what in (
        ("hook_heavy", "hook-heavy 150x(Linear,ReLU), 4 hooks/Linear"),
        ("transformer", "TransformerEncoder 2x256, pre+fwd hook on every module"),
    ):
        found = totals(session(*MODELS[name]()))
        rows.append(
            Row(
                f"{name}_bytecodes",
                f"{what}: Python bytecodes of a whole one-step session (open, step, end, trace built); "
                "target = ModuleTracker's step (load-independent; not a time)",
                "bytecodes",
                found["module_tracker"],
                [float(found["session"])],
                details=found,
            )
        )
    return rows


def main(argv: list[str]) -> int:
    phase = argv[0] if argv else "all"
    model = argv[1] if len(argv) > 1 else "hook_heavy"
    if phase not in (*PHASES, "all") or model not in MODELS:
        print(__doc__, file=sys.stderr)
        return 2
    counts = session(*MODELS[model]())
    for which in PHASES if phase == "all" else (phase,):
        print(f"-- {which}: the functions that ran most bytecodes")
        for (path, function, line), n in counts[which].most_common(25):
            print(f"{n:>9,}  {path}:{line} {function}")
    print(", ".join(f"{k} {v:,}" for k, v in totals(counts).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
