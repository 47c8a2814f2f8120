"""Notebook 10, sections 5-8: gradient accumulation's two rules, the logits and chunked cross-entropy, checkpointing,
AdamW's kernels, and the KV cache (random-weight tiny_llama on the CPU). Compile: test_language_ladder.py."""


import pandas as pd
import pytest

from labkit.errors import ConfigError
from labkit.labs.language import accumulation, kv_cache, logits, speed

pytest.importorskip("transformers")


def test_four_micro_batches_of_two_equal_eight_only_with_the_token_rule():
    grads = accumulation.accumulation_gradients(rows=8, grad_accum=4)
    assert len(set(grads["label_tokens"])) > 1, grads  # uneven micro-batches, where the old rule goes wrong
    assert grads["old_error"] > 0.05 and grads["labkit_error"] < 1e-5
    losses = accumulation.accumulation_losses(grad_accums=(1, 4), steps=4)
    assert len(losses) == 2 * 2 * 4
    most = losses.groupby("rule")["loss_change"].max()
    assert most["labkit"] < 1e-4 < 1e-3 < most["old"], most
    text = accumulation.accumulation_finding(grads, losses)
    assert text.startswith("Does 4 x 2 equal 8? Only with labkit's rule") and "over 4 steps" in text
    with pytest.raises(ConfigError, match=r"grad_accum=3.*divisor of rows=8"):
        accumulation.accumulation_gradients(rows=8, grad_accum=3)


def test_logits_sizes_by_formula():
    frame = logits.logits_sizes(4, 512).set_index("tokenizer")
    assert frame.loc["Llama 2", "logits_bytes"] == 250 * 2**20
    assert frame.loc["Llama 3", "with_gradient_bytes"] == 2 * 4 * 512 * 128256 * 4


def test_chunked_loss_lowers_the_peak_and_keeps_loss_and_gradients():
    frame = logits.chunked_loss_peaks(chunk_counts=(2, 8), width=128, repeats=2)
    assert list(frame["chunks"]) == [1, 2, 8]
    peaks = frame["peak_memory_bytes"].tolist()
    assert peaks[0] > frame["logits_bytes"].iloc[0] and peaks[2] < peaks[1] < peaks[0]
    assert peaks[2] < peaks[0] / 2, peaks
    assert (frame["loss_diff"] < 1e-5).all() and (frame["grad_diff"] < 1e-5).all()
    assert "the same loss and gradients" in logits.logits_finding(frame)
    with pytest.raises(ConfigError, match=r"chunk_counts=\(1, 4\)"):
        logits.chunked_loss_peaks(chunk_counts=(1, 4))


def test_every_adamw_kernel_is_timed_and_the_finding_reads_the_spreads():
    frame = speed.optimizer_kernels(repeats=5)
    assert list(frame["impl"]) == ["forloop", "foreach", "fused"]
    assert (frame["step_time_p10_s"] <= frame["step_time_s"]).all() and (frame["step_time_s"] > 0).all()
    assert frame["num_params"].iloc[0] > 1e6
    rows = [{"impl": "a", "step_time_s": 1.0, "step_time_p10_s": 0.9, "step_time_p90_s": 1.1, "num_tensors": 3,
             "num_params": 10},
            {"impl": "b", "step_time_s": 1.05, "step_time_p10_s": 1.0, "step_time_p90_s": 1.2, "num_tensors": 3,
             "num_params": 10},
            {"impl": "c", "step_time_s": 0.5, "step_time_p10_s": 0.45, "step_time_p90_s": 0.55, "num_tensors": 3,
             "num_params": 10}]
    text = speed.optimizer_finding(pd.DataFrame(rows))
    assert "b step time within the noise (1.05x)" in text and "c 0.5x the step time (faster)" in text


def test_layer_checkpointing_keeps_fewer_activations():
    frame = speed.checkpointing_runs()
    off, on = frame.iloc[0], frame.iloc[1]
    assert on["activation_bytes"] < 0.7 * off["activation_bytes"]
    assert speed.checkpointing_finding(frame).startswith("Checkpointing every decoder layer: activations")


def test_the_kv_cache_generates_the_same_tokens_and_holds_what_the_formula_says():
    frame = kv_cache.generation_speed(prompt_len=16, new_tokens=12, repeats=3).set_index("use_cache")
    assert frame["same_tokens"].all()
    assert frame.loc[True, "cache_bytes"] == frame.loc[True, "formula_cache_bytes"] == 4 * 4 * 4 * 32 * 2 * 27
    assert frame.loc[False, "cache_bytes"] == 0
    text = kv_cache.generation_finding(frame.reset_index())
    assert "the same tokens" in text and "as the formula says" in text


def test_grouped_query_attention_caches_a_quarter():
    frame = kv_cache.gqa_cache_sizes(groups=(1, 4))
    assert frame["kv_heads"].tolist() == [4, 1] and frame["ratio"].tolist() == [1.0, 0.25]
    assert (frame["bytes_per_token"] == frame["measured_bytes_per_token"]).all()
    assert frame["bytes_per_token"].iloc[0] == 2 * 4 * 4 * 32 * 4
    assert frame["num_params"].iloc[1] < frame["num_params"].iloc[0]
    assert kv_cache.gqa_finding(frame) == ("MHA (4 KV heads) caches 4096 bytes per token; "
                                           "GQA-4 (1 KV head) 1024 bytes per token, 0.25x.")
