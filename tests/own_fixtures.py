"""A learner-shaped model folder and data files, made offline for the tests of a learner's own fine-tune."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.models.own import write_config_dir
from labkit.text.tokenizer_dir import write_tokenizer_dir

# CPU-sized: the architecture's fields kept (GQA, tied embeddings, q/k/v biases), the widths shrunk
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1024}


def model_dir(root: Path, repo: str = "Qwen/Qwen2.5-0.5B", template: str = "marked", **overrides) -> str:
    """A folder holding ``repo``'s shipped config.json, shrunk, and a tokenizer trained here with ``template``."""
    folder = write_config_dir(repo, Path(root) / f"{repo.replace('/', '--')}-{template}", **{**TINY, **overrides})
    write_tokenizer_dir(folder, template)
    return str(folder)


def write_jsonl(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def prompt_completion(count: int = 24) -> list[dict]:
    return [{"prompt": f"What is {i} plus {i}? ", "completion": f"It is {2 * i}."} for i in range(count)]


def chats(count: int = 24) -> list[dict]:
    return [{"messages": [{"role": "system", "content": "Answer in one word."},
                          {"role": "user", "content": f"Name the number after {i}."},
                          {"role": "assistant", "content": f"{i + 1}"},
                          {"role": "user", "content": "And after that?"},
                          {"role": "assistant", "content": f"{i + 2}"}]} for i in range(count)]
