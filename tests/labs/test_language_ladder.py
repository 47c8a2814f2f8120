"""Notebook 10's speed ladder: each rung adds one change to the one below, every rung runs, the finding compares
neighbours within their measured spreads."""

import math

import pytest
import torch

import labkit
from labkit import results
from labkit.errors import ConfigError
from labkit.labs.language import ladder, speed
from labkit.techniques.compiling import compile_problem

pytest.importorskip("transformers")


def _cfg():
    """Notebook 10's ladder (sections 7 and 9): its compiled decoder layer is the one this file compiles, so that
    Inductor's disk cache holds it when the notebook runs after the unit tests (one cold compile, not two)."""
    return speed.speed_config(batch_size=8, seq_len=64, device="cpu")


def test_each_rung_changes_one_thing():
    configs = ladder.ladder_configs(_cfg())
    assert list(configs) == list(ladder.RUNGS)
    rows = [c.to_dict() for c in configs.values()]
    changed = [{k for k in a if a[k] != b[k]} for a, b in zip(rows, rows[1:], strict=False)]
    assert changed[1:] == [{"attn_implementation"}, {"packing"}, {"optimizer_impl"}, {"compile"},
                           {"checkpointing", "loss_chunks", "batch_size"}]
    assert rows[0]["precision"] == "fp32" and rows[0]["packing"] == "pad_max"
    with pytest.raises(ConfigError, match="cfg.dataset='shapes10'"):
        ladder.ladder_configs(labkit.RunConfig())


def test_a_precision_rung_that_resolves_to_fp32_is_the_baseline_run_and_says_so():
    with labkit.machine.described("cpu_avx2"):  # auto: fp32 where bf16 would be emulated
        configs = ladder.ladder_configs(_cfg())
    assert configs["+precision"] == configs["baseline"]
    with labkit.machine.described("cpu_bf16"):
        assert ladder.ladder_configs(_cfg())["+precision"].precision == "bf16"
    import pandas as pd

    rows = [{"rung": "baseline", "real_tokens_per_s": 100.0, "peak_memory_bytes": 2**20, "error": None,
             "time_per_real_token_p10_s": 0.010, "time_per_real_token_p90_s": 0.011, "same_run_as_below": False,
             "precision_used": "fp32"},
            {"rung": "+precision", "real_tokens_per_s": 100.0, "peak_memory_bytes": 2**20, "error": None,
             "time_per_real_token_p10_s": 0.010, "time_per_real_token_p90_s": 0.011, "same_run_as_below": True,
             "precision_used": "fp32"}]
    assert "+precision the same run here (fp32)" in ladder.Ladder(pd.DataFrame(rows)).finding()


def test_compile_reports_its_time_apart_from_the_steps():
    cfg = ladder.ladder_configs(_cfg())["+fused AdamW"]
    result = speed.compile_runs(cfg)
    frame = result.frame
    off, on = frame.iloc[0], frame.iloc[1]
    assert off["compile_time_s"] is None or math.isnan(off["compile_time_s"])
    assert on["step_time_s"] > 0
    if compile_problem(torch.device("cpu")) is None:
        assert on["compile_time_s"] > 0
        assert result.finding().startswith("Compiled: step time ")
        # the engine's runs behind the rows (from the cache): the compiling step is kept out of the timed ones, and
        # the compiled model trains as the eager one does
        eager, compiled = (results.cached_fit(cfg.replace(compile=flag), progress=False) for flag in (False, True))
        assert eager.compile_time_s is None and compiled.step_time_s < compiled.compile_time_s
        assert compiled.losses == pytest.approx(eager.losses, rel=1e-3)
        assert compiled.flops_per_step == eager.flops_per_step and compiled.warnings == []
    else:
        assert "NOT COMPILED" in on["warnings"] and result.finding().startswith("Not compiled here")


def test_the_ladder_runs_every_rung_and_words_a_finding():
    result = ladder.speed_ladder(_cfg(), progress=False)
    frame = result.frame
    assert list(frame["rung"]) == list(ladder.RUNGS) and frame["error"].isna().all()
    assert (frame["real_tokens_per_s"] > 0).all()
    by_rung = frame.set_index("rung")
    assert by_rung.loc["+packing", "pad_fraction"] < by_rung.loc["+SDPA", "pad_fraction"]
    assert by_rung.loc["+compile", "compile_time_s"] > 0
    text = result.finding()
    assert "rung" in result.show_columns() and "Top rung" in repr(result)
    assert text.startswith("Real tokens/s, each rung against the one below: +precision") and "Top rung" in text


def test_the_finding_calls_a_rung_faster_only_when_its_time_per_real_token_lies_below():
    import pandas as pd

    rows = [{"rung": "baseline", "real_tokens_per_s": 100.0, "peak_memory_bytes": 2**20, "error": None,
             "time_per_real_token_s": 1 / 100.0,
             "time_per_real_token_p10_s": 0.010, "time_per_real_token_p90_s": 0.011},
            {"rung": "+SDPA", "real_tokens_per_s": 200.0, "peak_memory_bytes": 2**20, "error": None,
             "time_per_real_token_s": 1 / 200.0,
             "time_per_real_token_p10_s": 0.004, "time_per_real_token_p90_s": 0.006},
            {"rung": "+packing", "real_tokens_per_s": 190.0, "peak_memory_bytes": 2**20, "error": None,
             "time_per_real_token_s": 1 / 190.0,
             "time_per_real_token_p10_s": 0.005, "time_per_real_token_p90_s": 0.0065}]
    text = ladder.Ladder(pd.DataFrame(rows)).finding()
    assert "+SDPA 2x (faster)" in text and "+packing 0.95x (within the noise)" in text
