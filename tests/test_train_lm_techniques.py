"""The technique fields on a language model through `labkit.fit`: chunked loss, per-layer checkpointing, LoRA,
freezing and compiling (compile time kept out of the step time, a loud fallback where nothing compiles)."""

import pytest
import torch

import labkit
from labkit.kinds import language as train_lm

pytest.importorskip("transformers")


@pytest.fixture
def lm_cfg():
    return labkit.RunConfig(model="tiny_llama", dataset="digits_sort", batch_size=8, max_steps=6, train_size=64,
                            pretrained=False, device="cpu", packing="pack", evaluate=False)


def test_chunked_loss_trains_exactly_as_one_cross_entropy(lm_cfg):
    whole, chunked = (labkit.fit(lm_cfg.replace(loss_chunks=chunks), progress=False) for chunks in (None, 4))
    assert chunked.losses == pytest.approx(whole.losses, rel=1e-4)
    assert chunked.config["loss_chunks"] == 4


def test_layer_checkpointing_trains_the_same_and_keeps_fewer_activations(lm_cfg):
    cfg = lm_cfg.replace(batch_size=16, train_size=128, seq_len=128, max_steps=5)
    plain, checkpointed = (labkit.fit(cfg.replace(checkpointing=on), progress=False) for on in (False, True))
    assert checkpointed.losses == pytest.approx(plain.losses, rel=1e-4)
    assert checkpointed.memory["activations"] < 0.7 * plain.memory["activations"]
    assert plain.flops_per_step < checkpointed.flops_per_step  # the recomputed forward is counted


def test_lora_on_the_attention_projections_trains_a_small_share(lm_cfg):
    res = labkit.fit(lm_cfg.replace(lora_rank=4, lora_targets=["q_proj", "v_proj"]), progress=False)
    assert 0 < res.num_trainable_params < 0.1 * res.num_params
    assert res.losses[-1] < res.losses[0]
    frozen = labkit.fit(lm_cfg.replace(freeze="head_only"), progress=False)
    assert frozen.num_trainable_params < res.num_params / 4


# compile=True through the engine (compile time kept out of the step time, the same losses as eager): checked on
# notebook 10's ladder config in tests/labs/test_language_ladder.py, whose compiled graph Inductor's cache then
# holds for the notebook (a second cold compile here cost about 20 s of CI)


def test_compile_without_a_compiler_falls_back_loudly(lm_cfg, monkeypatch, capsys):
    monkeypatch.setattr(train_lm, "compile_problem", lambda device: "no C++ compiler here")
    res = labkit.fit(lm_cfg.replace(compile=True), progress=False)
    assert res.compile_time_s is None and any("NOT COMPILED: no C++ compiler here" in w for w in res.warnings)
    assert torch.isfinite(torch.tensor(res.losses)).all()
