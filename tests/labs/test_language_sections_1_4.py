"""Notebook 10, sections 1-4 on the CPU with random weights: tokens against characters, the 6 N + attention FLOPs
against torch's counter, eager attention's L^2 probabilities against SDPA, padding against packing and the packed
documents kept apart only without a cache."""

import pandas as pd
import pytest

from labkit.errors import ConfigError
from labkit.labs.language import attention, packing, throughput, tokens

pytest.importorskip("transformers")


def test_the_bpe_needs_fewer_tokens_than_characters_for_every_paragraph():
    lengths = tokens.paragraph_lengths(200)
    assert len(lengths) == 200 and (lengths["pydoc_bpe"] < lengths["characters"]).all()
    summary = tokens.length_summary(lengths).set_index("tokenization")
    assert summary.loc["characters", "chars_per_token"] == 1
    assert 2 < summary.loc["pydoc_bpe", "chars_per_token"] < 8
    assert summary.loc["pydoc_bpe", "median_tokens"] < summary.loc["pydoc_bpe", "p90_tokens"] <= \
        summary.loc["pydoc_bpe", "max_tokens"]
    with pytest.raises(ConfigError, match="num_paragraphs=0"):
        tokens.paragraph_lengths(0)


def test_a_batch_in_tokens_is_rows_times_width_and_packing_fills_it():
    padded, packed = (tokens.batch_in_tokens(8, 64, p) for p in ("pad_max", "pack"))
    for batch in (padded, packed):
        assert batch["tokens"] == batch["rows"] * batch["width"] == 8 * 64
        assert batch["label_tokens"] == batch["real_tokens"] - batch["documents"]  # no label on each first token
    assert padded["documents"] == 8 < packed["documents"]
    assert packed["pad_fraction"] < padded["pad_fraction"]
    counts = tokens.token_counts(200, 8, 64, "pack")
    assert counts.batch == packed and len(counts) == 2
    assert counts.finding().startswith("The pydoc BPE covers") and "8 rows x 64 = 512 tokens" in counts.finding()


def test_six_n_plus_attention_is_the_flop_counters_count():
    result = throughput.flops_check(throughput.lm_config(seq_len=32, batch_size=2, max_steps=5))
    check = result.row
    assert check["tokens_per_step"] == 64
    assert check["formula_over_counted"] == pytest.approx(1, rel=0.15)
    assert 0 < check["attention_share"] < 0.5 and check["tokens_per_s"] > 0
    assert check["mfu"] is None and check["peak_flops"] is None  # a CPU has no datasheet peak
    assert "MFU needs the device's datasheet peak" in result.finding()
    given = {**check.to_dict(), "peak_flops": 4 * check["achieved_flops"], "mfu": 0.25}
    assert "MFU 25 %" in throughput.FlopsCheck.of(given).finding()


def not_again(*args, **kwargs):
    raise AssertionError("a cached measurement was run again")


def test_eager_attention_keeps_the_probabilities_sdpa_does_not(monkeypatch):
    result = attention.attention_memory((16, 64), batch_size=2, max_steps=5)
    frame = result.frame
    monkeypatch.setattr(attention, "fit", not_again)  # a rerun reads the table back from the results cache
    pd.testing.assert_frame_equal(attention.attention_memory((16, 64), batch_size=2, max_steps=5).frame, frame)
    with pytest.raises(AssertionError, match="run again"):
        attention.attention_memory((16, 64), batch_size=2, max_steps=5, refresh=True)
    last = frame.iloc[-1]
    assert last["eager_activation_bytes"] > last["sdpa_activation_bytes"]
    assert result.growth_exponent() > 1.5  # 4x the length, more than 8x the extra memory
    assert 0.5 < last["extra_over_probabilities"] < 1.5
    assert attention.probabilities_bytes(2, 64) == 2 * 4 * 64 * 64 * 4 * 4
    assert result.finding().startswith("Eager attention's extra activations grow about quadratic")
    assert "eager's step time " in result.finding() and "against SDPA's" in result.finding()
    with pytest.raises(ConfigError, match="seq_lens="):
        attention.attention_memory((64, 16))


def test_packing_removes_padding(monkeypatch):
    result = packing.packing_runs(rounds=1, seq_len=128, batch_size=4)
    frame = result.frame.set_index("packing")
    monkeypatch.setattr(packing, "fit", not_again)
    pd.testing.assert_frame_equal(packing.packing_runs(rounds=1, seq_len=128, batch_size=4).frame.set_index("packing"),
                                  frame)
    pad = frame["pad_fraction"]
    assert pad["pack"] < pad["pad"] < pad["pad_max"]
    assert (frame["real_tokens_per_s"] < frame["tokens_per_s"]).all()
    assert (frame["time_per_real_token_p10_s"] <= frame["time_per_real_token_p90_s"]).all()
    assert result.finding().startswith("Against pad: pad ")


def test_packed_documents_attend_across_only_with_a_cache():
    result = packing.cross_document_check(num_documents=3, seq_len=96)
    check = result.row
    assert check["max_logit_diff_cache_off"] < 1e-4
    assert check["max_logit_diff_cache_on"] > 1e-3
    assert check["packed_loss"] == pytest.approx(check["separate_loss"], rel=1e-5)
    assert "cache on, ATTENDING ACROSS" in result.finding()
    with pytest.raises(ConfigError, match="num_documents=100"):
        packing.cross_document_check(num_documents=100, seq_len=96)
