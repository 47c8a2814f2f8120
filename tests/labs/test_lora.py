"""labkit.labs.lora and RunConfig's LoRA fields: fit trains only adapters and head, PEFT agrees, the paper's count."""

import pytest
import torch

import labkit
from labkit import results
from labkit.config import RunConfig, parse_yaml
from labkit.errors import ConfigError
from labkit.labs import lora as lab
from labkit.techniques import lora


def small_cfg(**changes):
    values = dict(model="tiny_vit", max_steps=4, train_size=128, batch_size=16, evaluate=False)
    values.update(changes)
    return RunConfig(**values)


def test_config_fields_are_checked_by_name():
    assert small_cfg(lora_rank=4, lora_targets=["qkv"]).lora_targets == ("qkv",)  # YAML lists become tuples
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


def test_fit_trains_only_the_adapters_and_the_head():
    cfg = small_cfg(lora_rank=4, lora_targets=("qkv",), pretrained=False)
    torch.manual_seed(cfg.seed)
    start = labkit.models.build("tiny_vit", 10, pretrained=False)[0].state_dict()
    result = labkit.fit(cfg, progress=False)
    assert result.num_trainable_params == 4 * lora.adapter_numel(128, 384, 4) + 1_546
    trained = result.model.state_dict()
    assert torch.equal(trained["block1.attn.qkv.base.weight"], start["block1.attn.qkv.weight"])  # frozen
    assert torch.equal(trained["block2.mlp.0.weight"], start["block2.mlp.0.weight"])
    assert not torch.equal(trained["head.2.weight"], start["head.2.weight"])
    assert trained["block1.attn.qkv.lora_B"].abs().sum() > 0  # B moved off zero
    assert result.memory["optimizer_state"] < 0.1 * 8 * 545_930


def test_a_target_that_matches_nothing_names_the_config_field():
    with pytest.raises(ConfigError, match=r"lora_targets='q_proj' is not allowed: .*block1\.attn\.qkv"):
        labkit.fit(small_cfg(lora_rank=4, lora_targets=("q_proj",)), progress=False)


def test_cached_model_rebuilds_the_lora_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg = small_cfg(lora_rank=2, lora_targets="qkv")
    model, _ = results.cached_model(cfg, progress=False)
    again, _ = results.cached_model(cfg, progress=False)
    assert list(lora.lora_layers(again)) == list(lora.lora_layers(model))
    assert torch.equal(again.block1.attn.qkv.lora_B, model.block1.attn.qkv.lora_B)


def test_peft_agrees_on_parameters_outputs_and_gradients():
    pytest.importorskip("peft")
    frame = lab.peft_comparison(small_cfg(pretrained=False), rank=4)
    assert (frame.labkit_trainable_params == frame.peft_trainable_params).all()
    assert (frame.max_output_diff < 1e-5).all() and (frame.max_grad_diff < 1e-6).all() and (frame.max_grad > 0).all()


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


def test_sweep_configs_and_bad_ranks():
    runs = lab.sweep_configs(small_cfg(), ranks=(1, 4))
    assert list(runs) == ["full fine-tune", "head only", "LoRA qkv r1", "LoRA qkv r4", "LoRA all-linear r1",
                          "LoRA all-linear r4"]
    assert runs["LoRA qkv r4"].lora_targets == ("qkv",) and runs["LoRA qkv r4"].lr == lab.LORA_LR
    with pytest.raises(ConfigError, match="ranks"):
        lab.sweep_configs(small_cfg(), ranks=(0,))
    by_targets = lab.sweep_configs(small_cfg(), ranks={"qkv": (2, 8), "all-linear": (8,)})
    assert list(by_targets)[2:] == ["LoRA qkv r2", "LoRA qkv r8", "LoRA all-linear r8"]
    assert all(lab.MERGE_RANK in (ranks["qkv"] if isinstance(ranks, dict) else ranks) for ranks in lab.RANKS.values())


def _sweep(lora_rows, full_acc=0.8):
    import pandas as pd
    rows = [("full fine-tune", "full fine-tune", "-", 0, full_acc, 0.2, 0.19, 0.21),
            ("head only", "head only", "-", 0, 0.5, 0.05, 0.04, 0.06), *lora_rows]
    return pd.DataFrame([dict(setup=setup, method=method, targets=targets, rank=rank, accuracy=acc, step_time_s=step,
                              step_time_p10_s=p10, step_time_p90_s=p90, mem_activations_bytes=100, error=None)
                         for setup, method, targets, rank, acc, step, p10, p90 in rows])


def test_sweep_finding_is_one_verdict_line_from_the_numbers():
    qkv = [("LoRA qkv r2", "LoRA", "qkv", 2, 0.79, 0.15, 0.14, 0.16)]  # outside full's 0.19-0.21 spread
    linear = [("LoRA all-linear r2", "LoRA", "all-linear", 2, 0.7, 0.2, 0.18, 0.22)]  # inside it
    text = lab.sweep_finding(_sweep(qkv + linear), test_size=1000)
    assert "\n" not in text and "Best LoRA run (qkv r2) 79.0%, within the noise of full fine-tuning's 80.0%" in text
    assert "on qkv 0.75x (faster)" in text and "on all-linear 1.00x (no real difference)" in text
    assert "below" in lab.sweep_finding(_sweep(qkv, full_acc=0.95), test_size=1000)
    slow = [("LoRA qkv r2", "LoRA", "qkv", 2, 0.79, 0.3, 0.28, 0.32), ("LoRA qkv r8", "LoRA", "qkv", 8, 0.79, 0.15,
                                                                      0.14, 0.16)]
    assert "(mixed)" in lab.sweep_finding(_sweep(slow), test_size=1000)


def test_merge_and_transformer_and_qlora_paths(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg = small_cfg(evaluate=True)
    merged = lab.merge_comparison(cfg, rank=2)
    assert merged.max_output_diff.iloc[2] < 1e-4 and merged.lora_layers.tolist() == [0, 4, 0, 0]
    assert lab.merge_finding(merged).startswith("The base timed twice differed by")
    record = lab.transformer_finetune(cfg, rank=2, steps=2)
    assert record["peft_trainable"] == record["labkit_trainable"] > 0
    assert record["targets"] in ("query,value", "q_proj,v_proj")
    assert list((tmp_path / "models").glob("small_vit-*/config.json"))  # saved locally, loaded by from_pretrained
    # batch 8, no test-split evaluation: no assertion reads the accuracy or a batch-dependent number, and every step
    # and evaluation is emulated bf16 on a CPU (three evaluations were 29 s of this test's 79 s)
    qlora = lab.qlora_comparison(cfg.replace(batch_size=8, evaluate=False), rank=2)
    rows = qlora.set_index("setup")
    assert list(qlora.columns) == list(lab.QLORA_COLUMNS)
    if qlora.error.isna().all():
        assert 0.25 <= rows.base_weight_bytes.iloc[1] / rows.base_weight_bytes.iloc[0] < 0.32
    assert lab.qlora_finding(qlora).startswith(("NF4 weights", "QLoRA did not run"))
    assert "PEFT and add_lora train the same" in lab.transformer_finding(record)


def test_panel_run_and_own_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg = lab.panel_config(small_cfg()).replace(lora_rank=2)
    run = lab.panel_run(cfg)
    assert run.to_row()["targets"] == "qkv" and run.num_trainable_params == 4 * lora.adapter_numel(128, 384, 2) + 1_546
    assert results.cached_fit(lab.lora_config(small_cfg(), 2, "qkv")).num_trainable_params == run.num_trainable_params
    assert len(list(results.results_dir().glob("*.json"))) == 1  # the dropdown's "qkv" ran as the sweep's ("qkv",)
    with pytest.raises(ConfigError, match="lora_rank=None"):
        lab.panel_run(small_cfg())


def test_import_labkit_leaves_peft_and_transformers_alone():
    import subprocess
    import sys
    code = "import sys, labkit, labkit.labs; print('peft' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_small_transformers_vit_holds_tiny_vits_blocks():
    pytest.importorskip("transformers")
    vit = lab.small_vit_from_tiny_vit().eval()
    ours = labkit.models.build("tiny_vit", 10, pretrained=True)[0].eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = ours.stem(x)
        embedded = vit.vit.embeddings(x)
        assert torch.allclose(embedded[:, 1:], tokens, atol=1e-6) and embedded[:, 0].abs().max() == 0
        layers = vit.vit.layers if hasattr(vit.vit, "layers") else vit.vit.encoder.layer  # transformers 5 / 4
        for i, layer in enumerate(layers):
            out = layer(tokens)
            out = out[0] if isinstance(out, tuple) else out
            tokens = ours.get_submodule(f"block{i + 1}")(tokens)
            assert torch.allclose(out, tokens, atol=1e-5), i


def test_the_chart_frame_and_the_tables_a_learner_sees():
    import pandas as pd

    from labkit import display
    frame = pd.DataFrame({"setup": ["full fine-tune", "head only", "LoRA qkv r2", "LoRA qkv r8"],
                          "method": ["full fine-tune", "head only", "LoRA", "LoRA"], "rank": [0, 0, 2, 8],
                          "targets": ["-", "-", "qkv", "qkv"], "accuracy": [0.8, 0.5, 0.7, 0.75]})
    chart = lab.sweep_chart_frame(frame)
    assert sorted(chart.targets.unique()) == ["full fine-tune", "head only", "qkv"]
    assert chart[chart.targets == "full fine-tune"]["rank"].tolist() == [2, 8]  # flat across the LoRA ranks
    counts = display.frame(lab.target_table(small_cfg(), ranks=(1, 8)), ["trainable_params", "trainable_share"])
    assert list(counts.columns) == ["trainable parameters (thousands)", "trainable share of the parameters (%)"]


def test_merge_finding_calls_a_latency_different_only_outside_the_bases_two_timings():
    import pandas as pd

    def frame(unmerged, merged, again):
        return pd.DataFrame({"setup": list(lab.merge.SETUPS), "latency_s": [0.10, unmerged, merged, again],
                             "vs_base": [1.0, unmerged / 0.1, merged / 0.1, again / 0.1],
                             "max_output_diff": [float("nan"), 0.0, 1e-6, float("nan")], "lora_layers": [0, 4, 0, 0]})

    text = lab.merge_finding(frame(0.13, 0.089, 0.09))  # the base 10% apart: merged at 0.089 is within 0.081-0.11
    assert "differed by 10.0%" in text and "1.30x the base's latency (slower)" in text
    assert "merged 0.89x (the same within that)" in text
    assert "merged 0.80x (faster)" in lab.merge_finding(frame(0.13, 0.08, 0.099))
