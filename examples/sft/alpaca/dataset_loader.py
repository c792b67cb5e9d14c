"""Alpaca-style instruction rows for SFT (for example ``yahma/alpaca-cleaned``).

    areno train --algo sft --ckpt Qwen/Qwen3-0.6B --dataset-path yahma/alpaca-cleaned \
        --dataset-loader-fn examples/sft/alpaca/dataset_loader.py

Row contract
    in:  ``instruction`` (the task), ``input`` (optional extra context, often empty) and
         ``output`` (the reference reply);
    out: ``prompt`` (one user message: the instruction, then the input after a blank line when
         there is one) and ``response`` (the output). The trainer applies the chat template,
         tokenizes, and trains on the response tokens only.

Rows without an instruction or without an output are dropped (returning ``None`` drops a row).
"""


def load_row(row):
    """The default function ``--dataset-loader-fn`` calls for each raw row."""
    instruction = str(row.get("instruction") or "").strip()
    context = str(row.get("input") or "").strip()
    output = str(row.get("output") or "").strip()
    if not instruction or not output:
        return None
    content = f"{instruction}\n\n{context}" if context else instruction
    return {"prompt": [{"role": "user", "content": content}], "response": output}
