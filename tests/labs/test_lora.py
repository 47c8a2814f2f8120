"""labkit.labs.lora and RunConfig's LoRA fields on the language model: fit trains only the adapters, PEFT agrees
(outputs, gradients, save, reload, merge), the paper's count, QLoRA, the memory formula, merged inference."""

import importlib

import pandas as pd
import pytest
import torch

import labkit
from labkit import results
from labkit.config import RunConfig
from labkit.configfile import parse_yaml
from labkit.errors import ConfigError
from labkit.labs import lora as lab
from labkit.labs.lora import base, sweep
from labkit.labs.lora import qlora as qlora_module
from labkit.labs.lora.counts import SETUPS, MergeComparison, Roundtrip
from labkit.labs.lora.fits import CHECK_SEQ_LEN
from labkit.labs.lora.sweep import RankSweep
from labkit.techniques import lora


def small_cfg(**changes):
    values = dict(model="tiny_llama", dataset="digits_sort", max_steps=4, train_size=128, batch_size=16,
                  evaluate=False)
    values.update(changes)
    return RunConfig(**values)


def vit_cfg(**changes):
    values = dict(model="tiny_vit", max_steps=4, train_size=128, batch_size=16, evaluate=False)
    return RunConfig(**{**values, **changes})


def test_config_fields_are_checked_by_name():
    assert small_cfg(lora_rank=4, lora_targets=["q_proj"]).lora_targets == ("q_proj",)  # YAML lists become tuples
    with pytest.raises(ConfigError, match=r"lora_alpha=8 is not allowed: 16.0 \(the default\) unless lora_rank is set"):
        small_cfg(lora_alpha=8)
    with pytest.raises(ConfigError, match="lora_rank=0 is not allowed"):
        small_cfg(lora_rank=0)
    with pytest.raises(ConfigError, match="freeze='heavy' is not allowed: None when lora_rank is set"):
        small_cfg(lora_rank=4, freeze="heavy")
    with pytest.raises(ConfigError, match=r"lora_dropout=1.5 is not allowed: a number in \[0, 1\)"):
        small_cfg(lora_rank=4, lora_dropout=1.5)
    with pytest.raises(ConfigError, match="lora_targets=\\[\\] is not allowed"):
        small_cfg(lora_rank=4, lora_targets=[])


def test_yaml_lists_of_targets_load():
    cfg = RunConfig.from_dict(parse_yaml("model: tiny_vit\nlora_rank: 4\nlora_targets: [qkv, proj]\n", "test.yaml"))
    assert cfg.lora_targets == ("qkv", "proj")


def test_fit_trains_only_the_adapters_of_a_language_model():
    cfg = small_cfg(lora_rank=4, lora_targets=("q_proj", "v_proj"), pretrained=False)
    torch.manual_seed(cfg.seed)
    start = labkit.models.build_language_model("tiny_llama", 16, pretrained=False)[0].state_dict()
    result = labkit.fit(cfg, progress=False)
    assert result.num_trainable_params == 4 * 2 * lora.adapter_numel(128, 128, 4)  # the output layer stays frozen
    trained = result.model.state_dict()
    assert torch.equal(trained["model.layers.0.self_attn.q_proj.base.weight"],
                       start["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(trained["lm_head.weight"], start["lm_head.weight"])
    assert trained["model.layers.0.self_attn.q_proj.lora_B"].abs().sum() > 0  # B moved off zero
    assert result.memory["optimizer_state"] < 0.05 * 8 * result.num_params


def test_a_vision_models_head_still_trains_beside_its_adapters():
    result = labkit.fit(vit_cfg(lora_rank=4, lora_targets=("qkv",), pretrained=False), progress=False)
    assert result.num_trainable_params == 4 * lora.adapter_numel(128, 384, 4) + 1_546


def test_a_target_that_matches_nothing_names_the_config_field_and_the_layers():
    with pytest.raises(ConfigError, match=r"lora_targets='qkv' is not allowed: .*model\.layers\.0\.self_attn\.q_proj"):
        labkit.fit(small_cfg(lora_rank=4, lora_targets=("qkv",)), progress=False)
    with pytest.raises(ConfigError, match=r"lora_rank=256 is not allowed: at most min\(in, out\)"):
        labkit.fit(small_cfg(lora_rank=256, lora_targets=("q_proj",)), progress=False)


def test_cached_model_rebuilds_the_lora_language_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg = small_cfg(lora_rank=2, lora_targets=("q_proj", "v_proj"))
    model, _ = results.cached_model(cfg, progress=False)
    again, _ = results.cached_model(cfg, progress=False)
    assert list(lora.lora_layers(again)) == list(lora.lora_layers(model))
    name = "model.layers.1.self_attn.v_proj"
    assert torch.equal(again.get_submodule(name).lora_B, model.get_submodule(name).lora_B)


def test_peft_agrees_on_parameters_outputs_and_gradients():
    pytest.importorskip("peft")
    frame = lab.peft_comparison(small_cfg(pretrained=False), rank=4).frame
    assert frame.targets.tolist() == ["q_proj,v_proj", "all-linear"] and frame.layers.tolist() == [8, 28]
    assert (frame.labkit_trainable_params == frame.peft_trainable_params).all()
    assert (frame.max_output_diff < 1e-5).all() and (frame.max_grad_diff < 1e-6).all() and (frame.max_grad > 0).all()


def test_a_peft_adapter_saves_reloads_and_merges_as_labkits():
    pytest.importorskip("peft")
    saved = lab.peft_roundtrip(small_cfg(pretrained=False), rank=4).frame.iloc[0]
    # 8 adapters of 4 x (128 + 128) float32 numbers, plus the file's header and the adapter's config
    assert 8 * 4 * 256 * 4 < saved["adapter_bytes"] < 8 * 4 * 256 * 4 + 20_000
    assert saved["model_bytes"] > 795_776 * 4 and saved["adapter_share"] < 0.02
    assert saved["reload_diff"] == 0 and saved["merge_diff"] < 1e-5 and saved["lora_layers_after_merge"] == 0


def test_the_papers_roberta_base_count():
    pytest.importorskip("transformers")
    count = lab.paper_count()
    assert count["trainable"] == count["peft_trainable"] == 294_912 and count["adapted"] == 24
    assert lab.paper_count(rank=16)["trainable"] == 2 * 294_912


def test_the_blog_snippets_problems_are_measured_not_described():
    assert "class BlogLoRALayer" in lab.blog_snippet()
    happens = lab.blog_snippet_problems().what_happens
    assert "AttributeError" in happens.iloc[0]
    assert "RuntimeError" in happens.iloc[1] and "off by" in happens.iloc[1]
    assert "0.25x" in happens.iloc[2]  # 16 / 4 = 4: unscaled is a quarter
    assert "A's std is 1.0" in happens.iloc[3] and all(len(text) < 100 for text in happens)


def test_the_workload_follows_the_profile():
    assert [lab.workload(labkit.profile(p)).model for p in ("ci", "quick", "full")] == [
        "tiny_llama", "tiny_llama", "smollm2_135m"]
    cfg = lab.workload(labkit.profile("quick"))
    assert cfg.dataset == "digits_sort" and cfg.pretrained and cfg.max_steps == labkit.profile("quick").max_steps


def test_sweep_configs_and_bad_ranks():
    qv = "q_proj,v_proj"
    runs = sweep.sweep_configs(small_cfg(), ranks=(1, 4))
    assert list(runs) == ["full fine-tune", "head only", f"LoRA {qv} r1", f"LoRA {qv} r4", "LoRA all-linear r1",
                          "LoRA all-linear r4"]
    assert runs[f"LoRA {qv} r4"].lora_targets == ("q_proj", "v_proj") and runs[f"LoRA {qv} r4"].lr == base.LORA_LR
    with pytest.raises(ConfigError, match="ranks"):
        sweep.sweep_configs(small_cfg(), ranks=(0,))
    by_targets = sweep.sweep_configs(small_cfg(), ranks={qv: (2, 8), "all-linear": (8,)})
    assert list(by_targets)[2:] == [f"LoRA {qv} r2", f"LoRA {qv} r8", "LoRA all-linear r8"]
    assert all(base.MERGE_RANK in (ranks[qv] if isinstance(ranks, dict) else ranks) for ranks in base.RANKS.values())


def _sweep(lora_rows, full_acc=0.8):
    rows = [("full fine-tune", "full fine-tune", "-", 0, full_acc, 0.2, 0.19, 0.21),
            ("head only", "head only", "-", 0, 0.5, 0.05, 0.04, 0.06), *lora_rows]
    frame = pd.DataFrame([dict(setup=setup, method=method, targets=targets, rank=rank, accuracy=acc, step_time_s=step,
                               step_time_p10_s=p10, step_time_p90_s=p90, mem_activations_bytes=100, error=None)
                          for setup, method, targets, rank, acc, step, p10, p90 in rows])
    return RankSweep(frame, test_size=1000)


def test_sweep_finding_is_one_verdict_line_from_the_numbers():
    qkv = [("LoRA qkv r2", "LoRA", "qkv", 2, 0.79, 0.15, 0.14, 0.16)]  # outside full's 0.19-0.21 spread
    linear = [("LoRA all-linear r2", "LoRA", "all-linear", 2, 0.7, 0.2, 0.18, 0.22)]  # inside it
    text = str(_sweep(qkv + linear).finding()).replace("\n", " ")
    assert "Best LoRA run (qkv r2) 79.0% exact match against full fine-tuning's 80.0%: within the noise" in text
    assert "on qkv 0.75x (faster)" in text and "on all-linear 1.00x (within the noise)" in text
    assert "95.0%: below (±1.9%)" in str(_sweep(qkv, full_acc=0.95).finding()).replace("\n", " ")
    slow = [("LoRA qkv r2", "LoRA", "qkv", 2, 0.79, 0.3, 0.28, 0.32), ("LoRA qkv r8", "LoRA", "qkv", 8, 0.79, 0.15,
                                                                      0.14, 0.16)]
    assert "(mixed)" in _sweep(slow).finding()


def test_merge_and_qlora_paths(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg = small_cfg(evaluate=True)
    merged = lab.merge_comparison(cfg, rank=2)
    assert merged.frame.max_output_diff.iloc[2] < 1e-4 and merged.frame.lora_layers.tolist() == [0, 8, 0, 0]
    assert merged.finding().startswith("The base timed twice differed by")
    # batch 8, no test-split evaluation: every step is emulated bf16 on a CPU without native bf16
    qlora = lab.qlora_comparison(cfg.replace(batch_size=8, evaluate=False), rank=2)
    rows = qlora.frame.set_index("setup")
    assert list(qlora.frame.columns) == list(qlora_module.QLORA_COLUMNS) and rows.model.tolist() == ["tiny_llama"] * 2
    if rows.error.isna().all():
        assert abs(rows.bits_per_4bit_weight.iloc[1] - lab.NF4_BITS) < 0.01
        assert rows.base_weight_bytes.iloc[1] < rows.base_weight_bytes.iloc[0]
        assert rows.num_trainable_params.iloc[0] == rows.num_trainable_params.iloc[1]
    assert qlora.finding().startswith(("On tiny_llama, NF4 weights", "QLoRA did not run"))


def test_qlora_config_picks_model_precision_and_optimizer_by_profile_and_device(monkeypatch):
    cfg = qlora_module.qlora_config(small_cfg())
    assert (cfg.model, cfg.pretrained, cfg.precision, cfg.optimizer) == ("tiny_llama", True, "bf16", "adamw")
    assert not cfg.evaluate  # the section compares memory and step time: its runs are not scored
    monkeypatch.setenv("LABKIT_PROFILE", "full")
    steps = qlora_module.qlora_config(lab.workload()).max_steps  # a T4's QLoRA step of Qwen2.5-1.5B is about a second
    assert labkit.profile().warmup_steps + labkit.train.PROFILING_STEPS + 2 <= steps <= 30
    monkeypatch.delenv("LABKIT_PROFILE")
    assert qlora_module.qlora_optimizer(torch.device("cpu")) == "adamw"
    monkeypatch.setattr(labkit.finetune.qlora.quantization, "installed_version", lambda name: "0.50.2")
    assert qlora_module.qlora_optimizer(torch.device("cuda")) == "paged_adamw8bit"  # paged 8-bit AdamW where CUDA pages
    monkeypatch.setattr(labkit.finetune.qlora.quantization, "installed_version", lambda name: None)
    assert qlora_module.qlora_optimizer(torch.device("cuda")) == "adamw"
    assert lab.QLORA_MODELS["full"] == ("qwen2.5_1.5b", True) and lab.QLORA_MODELS["quick"][1] is False


@pytest.mark.parametrize(("machine", "expected"), [("t4", (torch.float16, torch.float32, "fp16")),
                                                    ("a100", (torch.bfloat16, torch.bfloat16, "bf16"))])
def test_qlora_dtypes_on_described_gpus(machine, expected):
    with labkit.machine.described(machine):  # a T4 emulates bf16: fp16 with float32 adapters for the GradScaler
        assert qlora_module.qlora_dtypes(torch.device("cuda")) == expected
        assert qlora_module.qlora_dtypes(torch.device("cpu")) == (torch.bfloat16, torch.bfloat16, "bf16")


def test_the_formula_matches_the_measured_peaks_within_its_stated_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    result = lab.estimate_check(small_cfg())
    check = result.frame
    assert check.setup.tolist() == ["full fine-tune", "LoRA q,v r8", "LoRA all-linear r8"]
    assert (check.tokens_per_step == 16 * CHECK_SEQ_LEN).all()
    assert (check.estimate_error.abs() <= lab.ESTIMATE_ERROR).all(), check
    assert abs(check.estimate_error.iloc[0]) < 0.05  # full fine-tuning: the tightest
    assert "within the ±15% it states" in result.finding()


def test_gpu_table_and_finding_for_a_t4_and_no_gpu():
    text = lab.gpu_table(gpu_bytes=15_828_320_256, gpu_name="Tesla T4").finding()  # torch's figure for Colab's T4
    assert text.startswith("On Tesla T4: full fine-tune up to Qwen2.5-0.5B; LoRA up to Qwen2.5-1.5B; QLoRA up to "
                           "Mistral-7B.")
    none = lab.gpu_table(gpu_bytes=None) if not torch.cuda.is_available() else None
    if none is not None:
        assert none.finding().startswith("On a T4 (no GPU here)")


def test_import_labkit_leaves_peft_and_transformers_alone():
    import subprocess
    import sys
    code = "import sys, labkit, labkit.labs; print('peft' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_chart_frame_and_the_tables_a_learner_sees():
    from labkit import display
    frame = pd.DataFrame({"setup": ["full fine-tune", "head only", "LoRA qkv r2", "LoRA qkv r8"],
                          "method": ["full fine-tune", "head only", "LoRA", "LoRA"], "rank": [0, 0, 2, 8],
                          "targets": ["-", "-", "qkv", "qkv"], "accuracy": [0.8, 0.5, 0.7, 0.75]})
    chart = RankSweep(frame).chart_frame()
    assert sorted(chart.targets.unique()) == ["full fine-tune", "head only", "qkv"]
    assert chart[chart.targets == "full fine-tune"]["rank"].tolist() == [2, 8]  # flat across the LoRA ranks
    table = lab.target_table(small_cfg(), ranks=(1, 8)).frame
    assert table.set_index(["targets", "rank"]).trainable_params[("q_proj,v_proj", 8)] == 16_384
    counts = display.frame(table, ["trainable_params", "trainable_share"])
    assert list(counts.columns) == ["trainable parameters (thousands)", "trainable share of the parameters (%)"]


def test_merge_finding_calls_a_latency_different_only_outside_the_bases_two_timings():
    def frame(unmerged, merged, again):
        return MergeComparison(pd.DataFrame({"setup": list(SETUPS), "latency_s": [0.10, unmerged, merged, again],
                             "vs_base": [1.0, unmerged / 0.1, merged / 0.1, again / 0.1],
                             "max_output_diff": [float("nan"), 0.0, 1e-6, float("nan")], "lora_layers": [0, 4, 0, 0]}))

    # the base 10% apart: each latency is as uncertain; merged at 0.089 (0.080-0.098) overlaps the base's 0.09-0.10
    text = str(frame(0.13, 0.089, 0.09).finding()).replace("\n", " ")
    assert "differed by 10.0%" in text and "latency 1.3x (slower)" in text
    assert "merged 0.89x (within the noise)" in text
    assert "merged 0.8x (faster)" in str(frame(0.13, 0.08, 0.099).finding()).replace("\n", " ")
    assert "no spread measured" in frame(0.13, 0.08, 0.1).finding()  # two equal timings: no noise measured


def test_the_roundtrip_finding_is_one_wrapped_verdict():
    text = Roundtrip(pd.DataFrame([{"adapter_bytes": 74_180, "model_bytes": 3_188_138, "adapter_share": 0.0233,
                                    "reload_diff": 0.0, "merge_diff": 1e-6, "lora_layers_after_merge": 0}])).finding()
    assert "74 kB against the model's 3.2 MB (2.33%)" in text.replace("\n", " ")
    assert all(len(line) <= 100 for line in str(text).splitlines())


def test_qlora_keeps_a_tied_output_layer_and_its_embeddings_in_float32(monkeypatch):
    # Casting a tied lm_head to fp16 cast the embeddings too: Qwen2.5's residual stream then ran in fp16 on a T4
    from labkit import machine, models

    monkeypatch.setenv("LABKIT_SHRINK", "1")  # Qwen2.5-1.5B's architecture at CPU size: tied, GQA, q/k/v biases
    cfg = small_cfg(model="qwen2.5_1.5b", dataset="pydoc_text", pretrained=False)
    with machine.described("t4"):  # fp16 base, float32 adapters
        model = qlora_module.qlora_model(cfg, qlora_module.BASE16, rank=2)  # built on the CPU, cast as for the T4
    assert models.output_layer_tied(model) and model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.base.weight.dtype == torch.float16 and layer.lora_A.dtype == torch.float32
    untied = qlora_module.qlora_model(small_cfg(device="cpu"), qlora_module.BASE16, rank=2)  # its own output layer
    assert untied.lm_head.weight.dtype == torch.bfloat16


def test_a_qlora_run_that_fails_is_a_row_with_its_error(monkeypatch):
    def overflow(*args, **kwargs):
        raise labkit.errors.NonFiniteLossError(3, float("nan"), "fp16")

    monkeypatch.setattr(qlora_module.train, "fit", overflow)
    row = qlora_module._qlora_row(qlora_module.qlora_config(small_cfg()), qlora_module.BASE16, rank=2)
    assert row["setup"] == qlora_module.BASE16 and row["error"].startswith("NonFiniteLossError")
    assert row["base_weight_bytes"]
    frame = pd.DataFrame([row, {"setup": qlora_module.NF4, "model": "tiny_llama", "error": "no 4-bit kernels here"}])
    text = qlora_module.QLoRAComparison(frame).finding()
    assert text.startswith("The 16-bit base did not run here: NonFiniteLossError")


def test_peft_refusing_colabs_torchao_is_said_before_get_peft_model(monkeypatch):
    # Colab's image (2026-08): PEFT 0.20 and a preinstalled torchao 0.10, which PEFT refuses mid-get_peft_model
    pytest.importorskip("peft")
    versions = {"torchao": "0.10.0"}
    monkeypatch.setattr(base.quantization, "installed_version", lambda name: versions.get(name))
    monkeypatch.setattr(importlib.import_module("peft"), "__version__", "0.20.0")
    with pytest.raises(labkit.errors.UnsupportedError, match=r"torchao='0.10.0' cannot run here: PEFT 0.20.0 refuses "
                                                             r"it .* needs torchao 0.16 or newer.*%pip install"):
        base.quiet_import("peft")
    versions["torchao"] = "0.18.0"
    assert base.quiet_import("peft").__name__ == "peft"
