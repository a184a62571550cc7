"""A dry run on meta (issue 27): time and peak memory of a 7B and a 70B Llama built under
`torch.device("meta")`, one training step (forward, backward, AdamW step), untraced and traced.

    python benchmarks/meta_dry_run.py            # 7B and 70B, 3 process pairs each (~2 min on 2 cores)
    python benchmarks/meta_dry_run.py --repeats 1 --only 7b

Each sample is its own process (a fresh interpreter: peak RSS is that process's own,
`resource.getrusage(RUSAGE_SELF).ru_maxrss`); untraced and traced alternate. Times inside the
child: the build, then the step (one step after a warm-up step untraced; traced: the whole
`with hooktrace.trace(model)` block around one step, its trace built after). Hooks: a forward
pre-hook, a forward hook and a full backward hook on every decoder layer. Needs transformers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CONFIGS = {
    # Llama-2-7B's shape
    "7b": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    # Llama-3-70B's shape
    "70b": dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
                num_attention_heads=64, num_key_value_heads=8, vocab_size=128256),
}  # fmt: skip


def child(size: str, traced: bool) -> dict:
    """One sample, in this process: build on meta, step, report times and peak RSS."""
    import resource

    t0 = time.perf_counter()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hooktrace

    imported = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**CONFIGS[size]))
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda m, a: None)
        layer.register_forward_hook(lambda m, a, o: None)
        layer.register_full_backward_hook(lambda m, gi, go: None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    built = time.perf_counter()

    def step() -> None:
        model(input_ids=ids).logits.sum().backward()
        opt.step()
        opt.zero_grad()

    events = 0
    if traced:
        with hooktrace.trace(model) as t:
            step()
        stepped = time.perf_counter()
        events = len(t.trace.events)
        finished = time.perf_counter()
    else:
        step()
        stepped = finished = time.perf_counter()
    return {
        "size": size,
        "traced": traced,
        "parameters": sum(p.numel() for p in model.parameters()),
        "import_s": imported - t0,
        "build_s": built - imported,
        "step_s": stepped - built,
        "trace_build_s": finished - stepped,
        "events": events,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def sample(size: str, traced: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", size] + (["--traced"] if traced else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_sample(size: str) -> float:
    """Wall time of `hooktrace run FACTORY --device meta` end to end (import, build, trace, tree)."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "llama_meta.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                "import torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\n\n"
                f"CONFIG = {CONFIGS[size]!r}\n\n"
                "def make():\n"
                "    with torch.device('meta'):\n"
                "        model = LlamaForCausalLM(LlamaConfig(**CONFIG))\n"
                "    for layer in model.model.layers:\n"
                "        layer.register_forward_hook(lambda m, a, o: None)\n"
                "    return model, {'input_ids': torch.zeros(1, 16, dtype=torch.long, device='meta')}\n"
            )
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hooktrace", "run", path, "--device", "meta"],
                       capture_output=True, check=True, timeout=600)  # fmt: skip
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=sorted(CONFIGS))
    parser.add_argument("--traced", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=sorted(CONFIGS, reverse=True))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.traced)))
        return
    print("size  traced  params   build s  step s (min/median/max)   peak RSS MB (median)  events")
    for size in sorted(args.only, key=lambda s: int(s[:-1])):
        rows: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(args.repeats):
            for traced in (False, True) if i % 2 == 0 else (True, False):  # alternate the order
                rows[traced].append(sample(size, traced))
        for traced, samples in rows.items():
            steps = [s["step_s"] for s in samples]
            print(
                f"{size:>4}  {'yes' if traced else 'no':>6}  {samples[0]['parameters'] / 1e9:5.1f}B  "
                f"{statistics.median(s['build_s'] for s in samples):7.2f}  "
                f"{min(steps):.2f} / {statistics.median(steps):.2f} / {max(steps):.2f}"
                f"{statistics.median(s['maxrss_mb'] for s in samples):24.0f}  {samples[0]['events']:>6}"
            )
        walls = [cli_sample(size) for _ in range(args.repeats)]
        print(f"{size:>4}  hooktrace run --device meta (wall, whole command): "
              f"{min(walls):.1f} / {statistics.median(walls):.1f} / {max(walls):.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
