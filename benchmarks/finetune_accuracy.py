"""The predicted peak (labkit.capacity.lm_training_memory) against the measured one, on config-built model shapes and
generated data of two shapes, full fine-tuning and LoRA, with and without per-layer checkpointing: the accuracy table
README and issue 42 state. Memory, not time: safe on a busy machine. Run: python benchmarks/finetune_accuracy.py
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from own_fixtures import chats, model_dir, write_jsonl  # noqa: E402

from labkit.finetune import Finetune, measure_methods  # noqa: E402

WIDE = {"hidden_size": 128, "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 3, "head_dim": 32}


def main() -> None:
    root = Path(tempfile.mkdtemp())
    data = {"prompt_completion": write_jsonl(root / "pc.jsonl", [
        {"prompt": "word " * (10 + 7 * i) + "? ", "completion": "answer " * (20 + 5 * i)} for i in range(24)]),
        "messages": write_jsonl(root / "chats.jsonl", chats(24))}
    print("| model | data | method | checkpointing | predicted (MiB) | measured (MiB) | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for repo in ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "mistralai/Mistral-7B-v0.1"):
        folder = model_dir(root, repo, **WIDE)
        for shape, path in data.items():
            mine = Finetune(folder, data=path, gpu="t4", seq_len=256, batch_size=4)
            for checkpointing in (False, True):
                cfg = mine.run_config().replace(checkpointing=checkpointing)
                for r in measure_methods(cfg, mine.shape).frame.itertuples():
                    print(f"| {repo} | {shape} | {r.method} | {checkpointing} | {r.predicted_bytes / 2**20:.2f} | "
                          f"{r.peak_memory_bytes / 2**20:.2f} | {r.error:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
