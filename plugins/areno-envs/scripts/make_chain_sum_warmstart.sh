#!/usr/bin/env bash
# Rebuild the rg-cpu/chain_sum warm start shipped in areno_envs/checkpoints/chain-sum-sft from
# scratch, with areno's own SFT on reasoning-gym's chain_sum problems (two terms of one or two
# digits, the training spec in areno_envs/data/chain_sum_train.jsonl).
#
#   plugins/areno-envs/scripts/make_chain_sum_warmstart.sh [RUN_DIR]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run="${1:-runs/chain-sum-sft}"
out="${here}/../areno_envs/checkpoints/chain-sum-sft"

areno train --recipe rg-cpu/chain_sum-sft --algo sft --save-path "${run}"
python -m areno_envs.rg.warmstart "${run}" --out "${out}"
