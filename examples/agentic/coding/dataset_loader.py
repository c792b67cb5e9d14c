"""Coding tasks as chat prompts for the coding agent.

    areno train ... --dataset-path examples/agentic/coding/dataset.jsonl \
        --dataset-loader-fn examples/agentic/coding/dataset_loader.py

Row contract
    in:  ``prompt`` (the task, in words: write a Python function ...), ``tests`` (Python code,
         usually ``assert`` lines, run after the model's code; kept from the model),
         optionally ``entry_point`` (the function's name) and ``id``;
    out: ``prompt`` (a system message on how to work and answer, then the task as a user
         message), ``task`` (the original text), ``tests``, ``entry_point`` and ``id``.

``reward.py`` reads ``tests`` from the row; ``run_agent.py`` sends only ``prompt`` to the
model. A row without a task or without tests is an error (a reward could never be earned).
"""

SYSTEM = (
    "You are a careful Python programmer. Solve the task with plain Python 3 and the standard "
    "library only. You can call the run_python tool to run code and see its stdout and "
    "stderr, for example to try your function on a few inputs; each call starts a fresh "
    "interpreter. When you are done, reply with the complete solution in a single "
    "```python code block and nothing after it."
)


def load_row(row):
    """The default function ``--dataset-loader-fn`` calls for each raw row."""
    task = row.get("prompt")
    tests = row.get("tests")
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"coding row {row.get('id', '?')}: 'prompt' must be the task text")
    if not isinstance(tests, str) or not tests.strip():
        raise ValueError(f"coding row {row.get('id', '?')}: 'tests' must be Python test code")
    return {
        "id": row.get("id"),
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task.strip()},
        ],
        "task": task,
        "tests": tests,
        "entry_point": row.get("entry_point"),
    }
