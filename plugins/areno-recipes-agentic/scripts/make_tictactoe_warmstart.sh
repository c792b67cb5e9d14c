#!/usr/bin/env bash
# Rebuild the agentic/tictactoe-cpu warm start shipped in
# areno_recipes_agentic/checkpoints/tictactoe-sft from scratch, with areno's own SFT.
#
#   plugins/areno-recipes-agentic/scripts/make_tictactoe_warmstart.sh [RUN_DIR]
#
# 300 SFT steps of 32 positions on a random 0.82M-parameter Qwen3 with the compact chat
# template (about 4 minutes on 2 idle CPU cores). provenance.json records the SHA-256 of the
# shipped weights; other CPUs or torch builds may differ in the last bits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run="${1:-runs/ttt-sft}"
out="${here}/../areno_recipes_agentic/checkpoints/tictactoe-sft"

areno train --recipe agentic/tictactoe-cpu-sft --save-path "${run}"
python -m areno_recipes_agentic.tictactoe.warmstart "${run}" --out "${out}"
python -m areno_recipes_agentic.tictactoe.evaluate --ckpt "${out}"
