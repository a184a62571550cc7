#!/usr/bin/env python
"""Machine instructions per hook-heavy step, traced / untraced, counted by valgrind's callgrind.

    python benchmarks/instructions.py [--steps 30]

Wall-clock ratios on a shared VM move with whatever else runs; instruction counts do not (the same
binary, inputs and environment give the same count, other load or not). Three runs of this script
under `valgrind --tool=callgrind` (in parallel, several minutes each: torch's import alone is about
6e9 instructions): set-up only, set-up + N untraced steps, set-up + N steps inside one open trace.
Each run does the same set-up (the model, a warm-up step, one traced step) and opens one more
trace (empty, or around the N steps), so the differences are the steps alone. Instructions are not time (cache misses and branch mispredictions weigh more in
the interpreter than in torch's kernels), so this complements `run.py`'s timed rows; it does not
replace them. Needs `valgrind` on PATH.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(mode: str, steps: int) -> None:
    sys.path.insert(0, str(HERE))
    import torch
    from capture_rows import hook_heavy_model

    import hooktrace

    torch.set_num_threads(1)
    model, step = hook_heavy_model()
    step()
    with hooktrace.trace(model):
        step()
    if mode == "traced":
        with hooktrace.trace(model):
            for _ in range(steps):
                step()
    else:  # the same session, empty: what differs from the traced run is the steps alone
        with hooktrace.trace(model):
            pass
        for _ in range(steps):
            step()


def count(mode: str, steps: int, out_dir: str) -> int:
    out = Path(out_dir) / f"callgrind.{mode}.{steps}"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    found = re.search(r"Collected\s*:\s*([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    if shutil.which("valgrind") is None:
        print("error: valgrind is not on PATH (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    runs = (("untraced", 0), ("untraced", args.steps), ("traced", args.steps))
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(runs)) as pool:
        base, untraced, traced = pool.map(lambda r: count(r[0], r[1], tmp), runs)
    per_untraced = (untraced - base) / args.steps
    per_traced = (traced - base) / args.steps
    print(
        f"hook-heavy step, instructions: untraced {per_untraced / 1e6:.2f} M, traced {per_traced / 1e6:.2f} M"
    )
    print(f"traced / untraced: {per_traced / per_untraced:.3f}  (set-up alone: {base / 1e9:.2f} G)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
