#!/usr/bin/env bash
# The order file of every sample, traced with the torch of the active environment (scripts/torch_matrix.sh
# runs it in each torch version's venv and compares the files between versions with `cmp`).
# Usage: scripts/sample_orders.sh OUT_DIR      (run from the repository root; `hooktrace` on PATH)
# Each sample runs as its docstring's "Run:" line says, with --format order; the exit code of each is
# written beside its file (OUT_DIR/NAME.rc: always_call and rank_divergence exit 1 by design).
set -uo pipefail
out=${1:?usage: scripts/sample_orders.sh OUT_DIR}
mkdir -p "$out"
one() {  # NAME hooktrace-args...
  local name=$1
  shift
  hooktrace "$@" >"$out/$name.log" 2>&1
  echo $? >"$out/$name.rc"
}
one always_call run samples/always_call.py --format order -o "$out/always_call.txt"
one backward_order run samples/backward_order.py --phase backward --format order -o "$out/backward_order.txt"
one checkpoint_recompute run samples/checkpoint_recompute.py --format order -o "$out/checkpoint_recompute.txt"
one forward_wrapper run samples/forward_wrapper.py --format order -o "$out/forward_wrapper.txt"
one fsdp_checkpoint run samples/fsdp_checkpoint.py --steps 2 --format order -o "$out/fsdp_checkpoint.txt"
one fsdp_two_ranks run --nproc 2 samples/fsdp_two_ranks.py --format order -o "$out/fsdp_two_ranks.txt"
one mixed_hooks run samples/mixed_hooks.py --steps 2 --format order -o "$out/mixed_hooks.txt"
one llama_meta run samples/llama_meta.py --device meta --format order -o "$out/llama_meta.txt"
one prepend_displaced run samples/prepend_displaced.py --format order -o "$out/prepend_displaced.txt"
one quantization run samples/quantization.py --no-backward --format order -o "$out/quantization.txt"
one quickstart run samples/quickstart.py --format order -o "$out/quickstart.txt"
one rank_divergence run --nproc 2 samples/rank_divergence.py --format order -o "$out/rank_divergence.txt"
one saved_tensors run samples/saved_tensors.py --format order -o "$out/saved_tensors.txt"
one trainer_script exec --start 2 --steps 1 --format order -o "$out/trainer_script.txt" samples/trainer_script.py
one training_step run samples/training_step.py --format order -o "$out/training_step.txt"
one transformer run samples/transformer.py --format order -o "$out/transformer.txt"
# --nproc writes one trace per rank (NAME.rankR.json): each rank's order file beside it
for rank in "$out"/*.rank*.json; do
  [ -e "$rank" ] && hooktrace render "$rank" --format order -o "${rank%.json}.txt" >/dev/null 2>&1
done
for rc in "$out"/*.rc; do printf '%s exit %s\n' "$(basename "$rc" .rc)" "$(cat "$rc")"; done
