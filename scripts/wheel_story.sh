#!/usr/bin/env bash
# A new user's install, from wheels: build the wheel of every published package (areno-core and
# the plugins; the internal smoke pack is not published), install the math recipe pack alone
# into a fresh virtual environment, and train a few steps of its CPU recipe there.
#
#   bash scripts/wheel_story.sh          # called by `bash scripts/dev.sh test`
#
# It proves the packaging, not the training: the recipe pack must bring its algorithms
# (areno-algos), the shipped warm start and data must be inside the wheels, and nothing may be
# read from the checkout (the commands run from an empty folder, and the checkout is not on the
# path).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
PACKAGES=(. plugins/areno-algos plugins/areno-recipes-math plugins/areno-recipes-agentic
  plugins/areno-sglang plugins/areno-trackers plugins/areno-envs)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "wheel story: building ${#PACKAGES[@]} wheels"
# From a copy without build/ and *.egg-info, so a stale build folder cannot leak into a wheel
# (and none is left in the checkout).
srcs=()
for pkg in "${PACKAGES[@]}"; do
  src="$work/src/$(basename "$(realpath "$pkg")")"
  mkdir -p "$src"
  tar -C "$pkg" --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ --exclude=./.git \
    --exclude=./plugins --exclude=./internal --exclude=./runs --exclude=./.venv -cf - . |
    tar -C "$src" -xf -
  srcs+=("$src")
done
# One build environment for all of them instead of pip's isolated one per package (which
# installed setuptools six times: 58 CPU-s for the six wheels against 15, measured): a fresh
# virtual environment with pip and only what the packages' [build-system] tables require, so a
# requirement missing there still fails the build. The wheels hold the same files.
"$PY" -m venv "$work/build"
mapfile -t build_requires < <("$PY" - "${srcs[@]}" <<'EOF'
import sys
import tomllib

requires = set()
for src in sys.argv[1:]:
    with open(f"{src}/pyproject.toml", "rb") as f:
        requires.update(tomllib.load(f)["build-system"]["requires"])
print("\n".join(sorted(requires)))
EOF
)
"$work/build/bin/python" -m pip install -q "${build_requires[@]}"
"$work/build/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "${srcs[@]}"
ls "$work/dist"

echo "wheel story: a fresh virtual environment, then pip install areno-recipes-math"
"$PY" -m venv "$work/venv"
vpy="$work/venv/bin/python"
# --no-compile: pip installs the same files but does not write bytecode for every module of
# torch, transformers and the rest up front (about 20 s of torch's 50 s install on a 2-core
# machine); Python compiles only the modules this story imports, when it first imports them.
# The CPU build of torch first, so pip does not resolve a CUDA build for areno-core's range.
"$vpy" -m pip install -q --no-compile "torch==2.13.0"
"$vpy" -m pip install -q --no-compile --find-links "$work/dist" areno-recipes-math

mkdir "$work/user"
cd "$work/user"
unset PYTHONPATH
areno=("$work/venv/bin/areno")
"${areno[@]}" plugins --json >plugins.json
"$vpy" - <<'EOF'
import json

report = json.load(open("plugins.json"))
dists = {p["distribution"] for p in report["plugins"]}
assert {"areno-core", "areno-algos", "areno-recipes-math"} <= dists, dists
assert not report["failures"], report["failures"]
EOF
# The SGLang engine's wheel, installed the way a remote-mode user without sglang does (its
# sglang dependency would pull a CUDA torch): areno lists the engine and its options, and a
# colocated run, which needs sglang, stops before loading anything with the install command.
"$vpy" -m pip install -q --no-compile --no-deps --find-links "$work/dist" areno-sglang
"${areno[@]}" plugins --json >plugins.json
"$vpy" - <<'EOF'
import json

report = json.load(open("plugins.json"))
[sglang] = [p for p in report["plugins"] if p["distribution"] == "areno-sglang"]
assert sglang["registered"] == {"rollout_engines": ["sglang"]}, sglang
assert "sglang_url" in sglang["options"]["rollout engine sglang"], sglang
EOF
if "${areno[@]}" train --algo grpo --recipe math/arith --rollout-engine sglang \
  --save-path sglang-run >sglang.out 2>&1; then
  echo "wheel story: a colocated sglang run without sglang installed did not fail" >&2
  exit 1
fi
grep -q "pip install areno-sglang" sglang.out
test ! -e sglang-run
# The issue's story: the GPU recipe resolves (a dry run; the model is a tiny random one here).
"${areno[@]}" train --algo gspo --recipe math/gsm8k --ckpt random:qwen3-tiny \
  --dataset-path "$REPO/data/gsm8k/train.jsonl" --dry-run >/dev/null
# And the CPU recipe trains: 3 steps from the warm start inside the wheel, evaluated on 20
# held-out problems before and after.
"${areno[@]}" train --algo gspo --recipe math/arith --max-steps 3 --save-interval 3 \
  --eval-limit 20 --save-path run
"$vpy" - <<'EOF'
import json
from pathlib import Path

lines = [json.loads(x) for x in Path("run/tensorboard/metrics.jsonl").read_text().splitlines()]
train = [x for x in lines if "train/loss" in x]
evals = [x for x in lines if "eval/accuracy" in x]
assert [x["step"] for x in train] == [1, 2, 3], train
assert [x["step"] for x in evals] == [0, 3], evals
assert (Path("run/step_3") / "model.safetensors").is_file()
print(f"wheel story: ok (eval/accuracy {evals[0]['eval/accuracy']:.2f} -> "
      f"{evals[-1]['eval/accuracy']:.2f} on 20 held-out problems)")
EOF
# The plot needs the pack's 'plot' extra (matplotlib), which a plain install does not bring:
# it says so in one line, without a traceback.
if "$vpy" -m areno_recipes_math.plot run --out reward.png >plot.out 2>&1; then
  echo "wheel story: the plot ran without matplotlib installed" >&2
  exit 1
fi
grep -q "pip install 'areno-recipes-math\[plot\]'" plot.out
if grep -q Traceback plot.out; then cat plot.out >&2; exit 1; fi
