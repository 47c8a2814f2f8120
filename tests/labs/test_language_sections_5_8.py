"""Notebook 10, sections 5-8: gradient accumulation's two rules, the logits and chunked cross-entropy, checkpointing,
AdamW's kernels, and the KV cache (random-weight tiny_llama on the CPU). Compile: test_language_ladder.py."""


import pandas as pd
import pytest

from labkit.errors import ConfigError
from labkit.labs.language import accumulation, exercises, kv_cache, logits, speed

pytest.importorskip("transformers")


def test_four_micro_batches_of_two_equal_eight_only_with_the_token_rule():
    rules = accumulation.accumulation_rules(rows=8, grad_accum=4, grad_accums=(1, 4), steps=4,
                                            accumulate=exercises.accumulate_solution)
    assert len(set(rules.label_tokens)) > 1, rules  # uneven micro-batches, where the old rule goes wrong
    assert rules.error("old") > 0.05 and rules.error("labkit") < 1e-5 and rules.error("yours") < 1e-5
    assert len(rules.losses) == 2 * 2 * 4
    most = rules.frame.set_index("rule")["loss_change"]
    assert most["labkit"] < 1e-4 < 1e-3 < most["old"], most
    text = rules.finding()
    assert text.startswith("Does 4 x 2 equal 8? Only with labkit's rule") and "over 4 steps" in text
    with pytest.raises(ConfigError, match=r"grad_accum=3.*divisor of rows=8"):
        accumulation.accumulation_rules(rows=8, grad_accum=3)


def test_logits_sizes_by_formula():
    frame = logits.logits_sizes(4, 512).frame.set_index("tokenizer")
    assert frame.loc["Llama 2", "logits_bytes"] == 250 * 2**20
    assert frame.loc["Llama 3", "with_gradient_bytes"] == 2 * 4 * 512 * 128256 * 4


def test_chunked_loss_lowers_the_peak_and_keeps_loss_and_gradients():
    result = logits.chunked_loss_peaks(chunk_counts=(2, 8), width=128, repeats=2)
    frame = result.frame
    assert list(frame["chunks"]) == [1, 2, 8]
    peaks = frame["peak_memory_bytes"].tolist()
    assert peaks[0] > frame["logits_bytes"].iloc[0] and peaks[2] < peaks[1] < peaks[0]
    assert peaks[2] < peaks[0] / 2, peaks
    assert (frame["loss_diff"] < 1e-5).all() and (frame["grad_diff"] < 1e-5).all()
    assert "the same loss and gradients" in result.finding()
    with pytest.raises(ConfigError, match=r"chunk_counts=\(1, 4\)"):
        logits.chunked_loss_peaks(chunk_counts=(1, 4))


def test_every_adamw_kernel_is_timed_and_the_finding_reads_the_spreads():
    frame = speed.optimizer_kernels(repeats=5).frame
    assert list(frame["impl"]) == ["forloop", "foreach", "fused"]
    assert (frame["step_time_p10_s"] <= frame["step_time_s"]).all() and (frame["step_time_s"] > 0).all()
    assert frame["num_params"].iloc[0] > 1e6
    rows = [{"impl": "a", "step_time_s": 1.0, "step_time_p10_s": 0.9, "step_time_p90_s": 1.1, "num_tensors": 3,
             "num_params": 10},
            {"impl": "b", "step_time_s": 1.05, "step_time_p10_s": 1.0, "step_time_p90_s": 1.2, "num_tensors": 3,
             "num_params": 10},
            {"impl": "c", "step_time_s": 0.5, "step_time_p10_s": 0.45, "step_time_p90_s": 0.55, "num_tensors": 3,
             "num_params": 10}]
    text = speed.OptimizerKernels(pd.DataFrame(rows)).finding()
    assert "b step time 1.05x (within the noise)" in text and "c step time 0.5x (faster)" in text


def test_layer_checkpointing_keeps_fewer_activations():
    result = speed.checkpointing_runs()
    frame = result.frame
    off, on = frame.iloc[0], frame.iloc[1]
    assert on["activation_bytes"] < 0.7 * off["activation_bytes"]
    assert result.finding().startswith("Checkpointing every decoder layer: activations")


def test_the_kv_cache_generates_the_same_tokens_and_holds_what_the_formula_says():
    result = kv_cache.generation_speed(prompt_len=16, new_tokens=12, repeats=3)
    frame = result.frame.set_index("use_cache")
    assert frame["same_tokens"].all()
    assert frame.loc[True, "cache_bytes"] == frame.loc[True, "formula_cache_bytes"] == 4 * 4 * 4 * 32 * 2 * 27
    assert frame.loc[False, "cache_bytes"] == 0
    text = result.finding()
    assert "the same tokens" in text and "as the formula says" in text


def test_grouped_query_attention_caches_a_quarter():
    result = kv_cache.gqa_cache_sizes(groups=(1, 4))
    frame = result.frame
    assert frame["kv_heads"].tolist() == [4, 1] and frame["ratio"].tolist() == [1.0, 0.25]
    assert (frame["bytes_per_token"] == frame["measured_bytes_per_token"]).all()
    assert frame["bytes_per_token"].iloc[0] == 2 * 4 * 4 * 32 * 4
    assert frame["num_params"].iloc[1] < frame["num_params"].iloc[0]
    assert result.finding() == ("MHA (4 KV heads) caches 4096 bytes per token; "
                                           "GQA-4 (1 KV head) 1024 bytes per token, 0.25x.")
