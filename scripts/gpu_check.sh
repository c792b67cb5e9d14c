#!/usr/bin/env bash
# The GPU acceptance check (docs/gpu.md): gpu tests, short bf16 GRPO runs, --tune-params,
# sglang when installed; one table and JSON under runs/gpu-check (or --out DIR).
# Exits at once, non-zero, on a machine without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m areno_core.gpu_check "$@"
