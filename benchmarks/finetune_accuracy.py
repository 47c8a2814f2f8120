"""The predicted peak (labkit.capacity.lm_training_memory) against the measured one (labkit.fit's peak_memory_bytes:
every live tensor on a CPU, the allocator on a GPU), on config-built models of three architectures and widths and on
generated data of two shapes: full fine-tuning, LoRA and QLoRA, fp32 and bf16 autocast, with and without per-layer
checkpointing. Memory, not time: safe on a busy machine. Run: python benchmarks/finetune_accuracy.py
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from own_fixtures import chats, model_dir, write_jsonl  # noqa: E402

from labkit.finetune import Finetune, measure_methods  # noqa: E402

SHAPES = {  # CPU widths, each architecture's own features kept (tied embeddings, GQA, q/k/v biases, head_dim)
    "Qwen/Qwen2.5-0.5B": {"hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "num_hidden_layers": 3},
    "meta-llama/Llama-3.2-1B": {"hidden_size": 192, "intermediate_size": 512, "num_attention_heads": 6,
                                "num_key_value_heads": 2, "num_hidden_layers": 2, "head_dim": 32},
    "mistralai/Mistral-7B-v0.1": {"hidden_size": 256, "intermediate_size": 640, "num_attention_heads": 8,
                                  "num_key_value_heads": 2, "num_hidden_layers": 2},
}


def main() -> None:
    root = Path(tempfile.mkdtemp())
    data = {"prompt_completion": write_jsonl(root / "pc.jsonl", [
        {"prompt": "word " * (10 + 7 * i) + "? ", "completion": "answer " * (20 + 5 * i)} for i in range(24)]),
        "messages": write_jsonl(root / "chats.jsonl", chats(24))}
    print("| model | data | method | precision | checkpointing | predicted (MiB) | measured (MiB) | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for repo, shape in SHAPES.items():
        folder = model_dir(root, repo, **shape)
        for name, path in data.items():
            mine = Finetune(folder, data=path, gpu="t4", seq_len=256, batch_size=4)
            for precision, methods in (("fp32", ("full", "lora")), ("bf16", ("full", "lora", "qlora"))):
                for checkpointing in (False, True):
                    cfg = mine.run_config().replace(checkpointing=checkpointing, precision=precision)
                    for r in measure_methods(cfg, mine.shape, methods).frame.itertuples():
                        print(f"| {repo} | {name} | {r.method} | {r.precision} | {checkpointing} | "
                              f"{r.predicted_bytes / 2**20:.2f} | {r.peak_memory_bytes / 2**20:.2f} | {r.error:+.1%} |",
                              flush=True)


if __name__ == "__main__":
    main()
