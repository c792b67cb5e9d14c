"""Math recipes for areno: GSM8K / NuminaMath loaders and a math-verify reward."""
