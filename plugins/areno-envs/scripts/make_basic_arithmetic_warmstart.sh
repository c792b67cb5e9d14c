#!/usr/bin/env bash
# Rebuild the rg-cpu/basic_arithmetic warm start shipped in
# areno_envs/checkpoints/basic-arithmetic-sft from scratch, with areno's own SFT on
# reasoning-gym's basic_arithmetic problems (two-digit sums, the training spec in
# areno_envs/data/basic_arithmetic_train.jsonl). One torch thread, as it was measured: the
# thread count changes the order of floating-point sums and so the exported weights.
#
#   plugins/areno-envs/scripts/make_basic_arithmetic_warmstart.sh [RUN_DIR]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run="${1:-runs/basic-arithmetic-sft}"
out="${here}/../areno_envs/checkpoints/basic-arithmetic-sft"
sft="areno train --recipe rg-cpu/basic_arithmetic-sft --algo sft"

export OMP_NUM_THREADS=1
${sft} --save-path "${run}"
python -m areno_envs.rg.warmstart "${run}" --out "${out}" \
  --command "OMP_NUM_THREADS=1 ${sft} --save-path runs/basic-arithmetic-sft"
