"""Notebook 10's section 10 (`labkit.labs.language.fits`): what fits a T4, and the profile's workload at full."""

import pytest

from labkit.capacity.lm_fits import Fits
from labkit.labs import language as lab

pytest.importorskip("transformers")


def test_the_t4_table_orders_the_methods_and_sizes_them_against_the_gpus():
    fits = lab.t4_fits(gpu_bytes=24 * 2**30)  # a 24 GiB GPU beside the T4
    table = fits.frame
    assert len(table) == 12 and list(table.method[:3]) == ["full fine-tune", "LoRA", "QLoRA"]
    for _, rows in table.groupby("model"):
        assert rows.total_bytes.is_monotonic_decreasing  # full > LoRA > QLoRA
    by = table.set_index(["model", "method"])
    assert by.fits_t4["Qwen2.5-1.5B", "full fine-tune"] == "no" and by.fits_t4["Qwen2.5-1.5B", "LoRA"] == "yes"
    assert by.fits_t4["Mistral-7B", "LoRA"] == "no" and by.fits_t4["Mistral-7B", "QLoRA"] == "yes"
    assert by.fits_your_gpu["Mistral-7B", "LoRA"] == "yes"  # 15.9 GiB: more than a T4, less than 24 GiB
    assert 7.2e9 < by.num_params["Mistral-7B", "QLoRA"] < 7.3e9  # Mistral 7B's published 7.24B
    assert lab.t4_fits(gpu_bytes=None).fits_your_gpu.isin(["no GPU", "yes", "no"]).all()
    assert "On a T4 (15 GiB usable): full fine-tune up to Qwen2.5-0.5B; LoRA up to Qwen2.5-1.5B; QLoRA up to " \
           "Mistral-7B. Mistral-7B needs" in fits.finding()
    mine = Fits(table, column="fits_your_gpu", where="my GPU").finding()
    assert mine.startswith("On my GPU: ") and "; LoRA up to Mistral-7B;" in mine


@pytest.mark.parametrize(("name", "model"), [("ci", "tiny_llama"), ("quick", "tiny_llama_10m"),
                                              ("full", "smollm2_135m")])
def test_the_profile_picks_the_language_workload(monkeypatch, name, model):
    monkeypatch.setenv("LABKIT_PROFILE", name)
    assert lab.speed_config().model == model


def test_the_speed_workload_lives_below_the_labs_that_share_it():
    from labkit import workloads
    assert lab.speed_config is workloads.lm_speed_config
    assert workloads.LM_SPEED_MODELS == {"ci": "tiny_llama", "quick": "tiny_llama_10m", "full": "smollm2_135m"}
