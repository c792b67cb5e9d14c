"""Math recipes for areno: ``math/arith`` (CPU), ``math/arith-sft`` and ``math/gsm8k`` (GPU);
GSM8K, NuminaMath and arithmetic loaders; math-verify and exact-match rewards."""
