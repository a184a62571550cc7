"""How much of step 0's time is first-call work: the root call's time at step 0 and step 1 of
`hooktrace run --steps 2`, and at the one traced step of `hooktrace run --warmup 1`, each in a fresh
process (first-call work is per process), on checkpointed models.

    python benchmarks/warmup.py            # 3 processes per variant and model
    python benchmarks/warmup.py --repeat 1

Prints, per model and variant, the root module's forward call (median over the processes) and the
sum of its direct children's calls in the same step, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import hooktrace
from hooktrace.analysis.calls import Call, calls

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "torch.utils.checkpoint, 2 blocks": "samples/checkpoint_recompute.py",
    "FSDP2 + composable checkpoint, 1 rank": "samples/fsdp_checkpoint.py",
}
VARIANTS = {  # name -> (hooktrace run options, the traced step to read)
    "step 0 (no warm-up)": (["--steps", "2"], 0),
    "step 1 (no warm-up)": (["--steps", "2"], 1),
    "--warmup 1, step 0": (["--warmup", "1"], 0),
}


def _root_and_children(trace: hooktrace.Trace, step: int) -> tuple[float, float]:
    """(the root's forward call, its direct children's calls summed), in ms, in `step`."""
    every = [c for c in calls(trace) if c.step == step and c.phase == "forward" and c.end is not None]
    root: Optional[Call] = next((c for c in every if c.module == ""), None)
    if root is None:
        raise SystemExit(f"no root forward call in step {step}")
    inside = [c for c in every if root.enter < c.enter and c.end <= root.end]  # type: ignore[operator]
    direct = [
        c
        for c in inside
        if not any(d.enter < c.enter and c.end <= d.end for d in inside if d is not c)  # type: ignore[operator]
    ]
    duration = {e.seq: e.duration_ns for e in trace.events if e.type == "enter"}
    return duration[root.enter] / 1e6, sum(duration[c.enter] for c in direct) / 1e6


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    exe = Path(sys.executable).with_name("hooktrace")
    print("| model | variant | root call (ms) | its children (ms) |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, sample in MODELS.items():
            for variant, (options, step) in VARIANTS.items():
                roots, children = [], []
                for i in range(args.repeat):
                    out = Path(tmp) / f"t{i}.json"
                    cmd = [str(exe), "run", sample, *options, "-o", str(out)]
                    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
                    if done.returncode != 0:
                        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr}")
                    root, kids = _root_and_children(hooktrace.load(str(out)), step)
                    roots.append(root)
                    children.append(kids)
                spread = f"{min(roots):.1f}-{max(roots):.1f}"
                print(
                    f"| {label} | {variant} | {statistics.median(roots):.1f} ({spread}) "
                    f"| {statistics.median(children):.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
