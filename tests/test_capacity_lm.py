"""A language model's fine-tuning memory by formula (`labkit.capacity.lm_memory`), checked against labkit's measured
peaks and against hand counts."""

import pytest

import labkit
from labkit.capacity import lm_training_memory, lora_parameters
from labkit.capacity.lm_memory import NF4_BYTES, decoder_shape
from labkit.errors import ConfigError

pytest.importorskip("transformers")

TOLERANCE = 0.05  # the module docstring's stated error


@pytest.mark.parametrize(("model", "attn", "checkpointing"), [
    ("tiny_llama", "sdpa", False),  # the logits dominate
    ("tiny_llama", "eager", True),
    ("tiny_llama_10m", "eager", False),  # the decoder layers dominate
    ("tiny_llama_10m", "sdpa", True),  # the gradients at the end of the backward pass set the peak
])
def test_the_estimate_is_within_its_stated_error_of_the_measured_peak(model, attn, checkpointing):
    cfg = labkit.RunConfig(model=model, dataset="pydoc_text", seq_len=128, batch_size=4, packing="pad_max",
                           attn_implementation=attn, checkpointing=checkpointing, pretrained=False, evaluate=False,
                           train_size=32, max_steps=4, device="cpu")
    measured = labkit.fit(cfg, progress=False).peak_memory_bytes
    estimate = lm_training_memory(model, seq_len=128, micro_batch=4, attn_implementation=attn,
                                  checkpointing=checkpointing, vocab_size=2048, foreach=False)["total"]  # a CPU's AdamW
    assert abs(estimate / measured - 1) < TOLERANCE, (estimate, measured)


def test_the_methods_count_what_they_keep():
    shape = decoder_shape("qwen2.5_1.5b")
    n = shape.num_parameters()
    full = lm_training_memory(shape, "full", precision="fp32")
    assert (full["weights"], full["gradients"], full["optimizer_state"]) == (4 * n, 4 * n, 8 * n)
    assert lm_training_memory(shape, "full", precision="bf16")["weights"] == 6 * n  # + autocast's half copy
    lora = lm_training_memory(shape, "lora", precision="bf16", lora_rank=8)
    adapters = lora_parameters(shape, 8)  # q (1536 -> 1536) and v (1536 -> 256) in 28 layers
    assert adapters == 28 * 8 * (1536 + 1536 + 1536 + 256)
    assert lora["gradients"] == 4 * adapters and lora["weights"] == 2 * n + 4 * adapters
    qlora = lm_training_memory(shape, "qlora", precision="bf16", lora_rank=8)
    linear = 28 * sum(shape.layer_linear_params().values())
    assert qlora["weights"] == round(NF4_BYTES * linear + 2 * (n - linear) + 4 * adapters)
    assert qlora["total"] < lora["total"] < full["total"]
    assert lora_parameters(shape, 8, "all") > adapters


def test_checkpointing_sdpa_and_the_vocabulary_move_the_right_terms():
    base = {"model": "smollm2_135m", "seq_len": 1024, "micro_batch": 4, "precision": "fp16"}
    plain = lm_training_memory(**base)
    assert lm_training_memory(**base, checkpointing=True)["activations"] < plain["activations"] / 5
    assert lm_training_memory(**base, attn_implementation="eager")["activations"] > 2 * plain["activations"]
    assert plain["logits"] == 4 * 1024 * 49152 * 12  # fp32 log-probs and two gradients (the fp16 logits are freed)
    assert lm_training_memory(**base, loss_chunks=8)["logits"] == plain["logits"] // 8


def test_bad_arguments_name_their_field():
    with pytest.raises(ConfigError, match="method='dora'.*full"):
        lm_training_memory("smollm2_135m", "dora")
    with pytest.raises(ConfigError, match="vocab_size=None"):
        lm_training_memory("tiny_llama")
    with pytest.raises(ConfigError, match=r"model='gpt5'.*smollm2_135m"):
        lm_training_memory("gpt5")
    with pytest.raises(ConfigError, match="lora_targets"):
        lora_parameters(decoder_shape("smollm2_135m"), 8, ["qkv"])
