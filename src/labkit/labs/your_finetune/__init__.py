"""Notebook 11 (your fine-tune): the learner's model and data, offline-made at ci/quick, from the hub at full."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

from ...downloads import cache_dir
from ...env import Profile, is_online
from ...finetune import ladder
from ...messages import note
from ...models.own import write_config_dir
from ...text.tokenizer_dir import write_tokenizer_dir

__all__ = ["HUB_DATA", "HUB_MODEL", "RUNGS", "SEQ_LEN", "workload", "write_data"]

HUB_MODEL, HUB_DATA = "Qwen/Qwen2.5-0.5B", "hf:trl-lib/Capybara@train[:1000]"
SEQ_LEN = 512  # a learner's first choice of seq_len; the seeded fault's prompts are longer than it
# CPU widths of Qwen2.5-0.5B's architecture (GQA, tied embeddings, q/k/v biases kept), and the data sizes
SIZES = {"ci": ({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128}, 48),
         "quick": ({"num_hidden_layers": 4, "hidden_size": 128, "intermediate_size": 352}, 160)}
# the ladder's rungs per profile (None: all): compile's first build costs a CPU about a minute
RUNGS = {"ci": ("+precision", "+SDPA", "+packing", "+fused AdamW", "LoRA"),
         "quick": tuple(rung for rung in ladder.RUNGS if rung != "+compile")}
WORDS = "the a model token batch memory step loss data train layer rank answer question".split()


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) + "."


def write_data(folder: Path, count: int, seed: int = 0) -> dict[str, str]:
    """JSONL files in ``folder``: prompt/completion pairs and chats of uneven lengths, and the seeded fault (pairs
    whose prompts are longer than `SEQ_LEN` tokens, so truncation leaves nothing to train); shape -> path."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [{"prompt": _sentence(rng, 4, 40) + " ", "completion": _sentence(rng, 2, 30)} for _ in range(count)]
    chats = [{"messages": [{"role": role, "content": _sentence(rng, 2, 14)} for _ in range(rng.randint(1, 3))
                           for role in ("user", "assistant")]} for _ in range(count)]
    faulty = [{"prompt": _sentence(rng, SEQ_LEN, 2 * SEQ_LEN), "completion": p["completion"]} for p in pairs]
    paths = {}
    for shape, records in (("prompt/completion", pairs), ("messages", chats), ("seeded fault", faulty)):
        path = folder / f"{shape.replace('/', '_').replace(' ', '_')}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths[shape] = str(path)
    return paths


def workload(profile: Profile) -> SimpleNamespace:
    """This notebook's model, data, ladder rungs and target for ``profile``: a config-built Qwen2.5-0.5B at CPU
    widths with generated data at ci/quick (and full shrunk); the hub's at full, generated data (said) offline.
    Fields: model, data, shapes (shape -> generated file), rungs, gpu, folder, train_steps."""
    name = "ci" if profile.shrunk else profile.name
    folder = cache_dir() / "11_your_finetune" / (name + "-shrunk" * profile.shrunk)
    fields, count = SIZES.get(name, SIZES["quick"])
    shapes = write_data(folder, count)
    model, data = HUB_MODEL, HUB_DATA
    if name in SIZES:
        model = str(write_config_dir(HUB_MODEL, folder / "model", num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=1024, **fields))
        write_tokenizer_dir(model, "plain")  # a chat template without generation marks: the audit says so
        data = shapes["messages"]
    elif not is_online():
        note(f"OFFLINE: {HUB_DATA} cannot be downloaded; this notebook uses generated chats instead "
             f"({shapes['messages']}). Connect and rerun for the hub's.")
        data = shapes["messages"]
    return SimpleNamespace(model=model, data=data, shapes=shapes, gpu="t4", folder=folder,
                           rungs=RUNGS.get(profile.name), train_steps=min(profile.max_steps, 16))
