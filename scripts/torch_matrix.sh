#!/usr/bin/env bash
# The README's "Torch versions" table, by hand (not run by CI, which runs torch 2.13.0 only).
# For each torch version: a venv OUTSIDE the checkout with that torch (the registry's build: on Linux
# the CUDA one, run on CPU; 6-7 GB) and hooktrace's dev extras installed without changing torch; the
# order file of every sample (scripts/sample_orders.sh), compared byte for byte with the reference
# version's; the source checks of scripts/check_torch_source.py on that torch's own installed files;
# then the whole suite and the slow set (-n 1: the machine's cores are shared). The venv is deleted after (KEEP=1 keeps it).
#
#   scripts/torch_matrix.sh [VERSION...]      default: 2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.14.1
#   TORCHVER_DIR=/tmp/torchver                 venvs, order files, logs
#   REFERENCE=2.13.0                           whose order files the others are compared with: made
#                                              with the `hooktrace` of the calling environment, which
#                                              must hold that torch (the developers' .venv)
#   SUITE=0                                    order files only, no suite
#   SUITE=slow                                 the slow set only (`-m slow`: ranks under torchrun,
#                                              the compile matrix, libraries, signals), no default suite
#   JOBS=1                                     pytest -n (xdist workers) for the suite
#
# torch 2.15 is not installable from this machine's package index: its sources (an unpacked wheel or
# PyTorch's public checkout at the v2.15.0 tag, outside the checkout) are checked instead with
#   python scripts/check_torch_source.py ROOT
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dir=${TORCHVER_DIR:-/tmp/torchver}
ref=${REFERENCE:-2.13.0}
mkdir -p "$dir"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.14.1)

if [ ! -d "$dir/orders-$ref" ]; then
  have=$(python -c "import torch; print(torch.__version__.split('+')[0])")
  [ "$have" = "$ref" ] || { echo "error: the reference order files need torch $ref here, not $have" >&2; exit 2; }
  PYTHONPATH="$repo" scripts/sample_orders.sh "$dir/orders-$ref" >/dev/null
fi

for v in "${versions[@]}"; do
  venv="$dir/venv-$v"
  echo "== torch $v"
  if [ ! -x "$venv/bin/hooktrace" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "torch==$v" || { echo "torch $v: cannot install"; continue; }
    echo "torch==$v" >"$dir/constraint-$v.txt"  # the dev extras must not change torch
    "$venv/bin/pip" install -q -e "$repo[dev]" -c "$dir/constraint-$v.txt" || { echo "torch $v: dev extras conflict"; continue; }
  fi
  got=$("$venv/bin/python" -c "import torch; print(torch.__version__)")
  echo "torch installed: $got"
  PATH="$venv/bin:$PATH" PYTHONPATH="$repo" scripts/sample_orders.sh "$dir/orders-$v" >"$dir/orders-$v.out" 2>&1
  same=0 differ=()
  for f in "$dir/orders-$ref"/*.txt; do
    n=$(basename "$f")
    if cmp -s "$f" "$dir/orders-$v/$n"; then same=$((same + 1)); else differ+=("$n"); fi
  done
  echo "sample order files byte-equal to torch $ref's: $same, differing: ${#differ[@]} ${differ[*]}"
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  PYTHONPATH="$repo" "$venv/bin/python" scripts/check_torch_source.py "$site" >"$dir/check-$v.log" 2>&1
  echo "source checks on its own files: $(tail -n 1 "$dir/check-$v.log")"
  if [ "${SUITE:-1}" != 0 ] && [ "${SUITE:-1}" != slow ]; then
    PATH="$venv/bin:$PATH" PYTHONPATH="$repo" "$venv/bin/python" -m pytest -n "${JOBS:-1}" -q -p no:cacheprovider -rfEs \
      >"$dir/suite-$v.log" 2>&1
    echo "suite: $(tail -n 1 "$dir/suite-$v.log")"
    grep -E "^(SKIPPED|FAILED|ERROR)" "$dir/suite-$v.log" | sed 's/^/  /'
  fi
  if [ "${SUITE:-1}" != 0 ]; then  # the slow set, as .ci/run runs it after the suite
    PATH="$venv/bin:$PATH" PYTHONPATH="$repo" "$venv/bin/python" -m pytest -m slow -n "${JOBS:-1}" -q -p no:cacheprovider -rfEs \
      >"$dir/slow-$v.log" 2>&1
    echo "slow set: $(tail -n 1 "$dir/slow-$v.log")"
    grep -E "^(SKIPPED|FAILED|ERROR)" "$dir/slow-$v.log" | sed 's/^/  /'
  fi
  [ "${KEEP:-0}" = 1 ] || rm -rf "$venv"
done
