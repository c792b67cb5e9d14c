"""SFT loader for GSM8K rows: the question is the prompt, the worked answer the response.

    areno train --algo sft --ckpt random:qwen3-tiny \
      --dataset-path data/gsm8k/train.jsonl \
      --dataset-loader-fn examples/sft/gsm8k_sft_loader.py
"""


def load_row(row):
    return {
        "prompt": [{"role": "user", "content": row["question"]}],
        "response": row["answer"],
    }
