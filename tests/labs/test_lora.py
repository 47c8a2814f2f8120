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
    assert (frame.labkit_trainable == frame.peft_trainable).all()
    assert (frame.max_output_diff < 1e-5).all() and (frame.max_grad_diff < 1e-6).all() and (frame.max_grad > 0).all()


def test_the_papers_roberta_base_count():
    pytest.importorskip("transformers")
    count = lab.paper_count()
    assert count["trainable"] == count["peft_trainable"] == 294_912 and count["adapted"] == 24
    assert lab.paper_count(rank=16)["trainable"] == 2 * 294_912


def test_seed_snippet_problems_are_shown_not_hidden():
    problems = lab.seed_snippet_problems()
    assert "AttributeError" in problems["what happens"].iloc[0]
    assert "RuntimeError" in problems["what happens"].iloc[1] and "off by" in problems["what happens"].iloc[1]
    assert "0.25x" in problems["what happens"].iloc[2]  # 16 / 4 = 4: unscaled is a quarter


def test_sweep_configs_and_bad_ranks():
    runs = lab.sweep_configs(small_cfg(), ranks=(1, 4))
    assert list(runs) == ["full fine-tune", "head only", "LoRA qkv r1", "LoRA qkv r4", "LoRA all-linear r1",
                          "LoRA all-linear r4"]
    assert runs["LoRA qkv r4"].lora_targets == ("qkv",) and runs["LoRA qkv r4"].lr == lab.LORA_LR
    with pytest.raises(ConfigError, match="ranks"):
        lab.sweep_configs(small_cfg(), ranks=(0,))


def test_sweep_finding_is_worded_from_the_numbers():
    import pandas as pd
    rows = []
    for setup, method, rank, share, acc, step in [("full fine-tune", "full fine-tune", 0, 1.0, 0.8, 0.2),
                                                  ("head only", "head only", 0, 0.01, 0.5, 0.05),
                                                  ("LoRA qkv r2", "LoRA", 2, 0.02, 0.79, 0.15)]:
        rows.append(dict(setup=setup, method=method, rank=rank, targets="qkv", num_trainable_params=int(share * 1000),
                         num_params=1000, trainable_share=share, mem_optimizer_state_bytes=share * 8000,
                         mem_activations_bytes=100 if method != "head only" else 10, accuracy=acc, step_time_s=step,
                         error=None))
    text = lab.sweep_finding(pd.DataFrame(rows), test_size=1000)
    assert "0.75x to 0.75x" in text and "within the noise" in text and "best LoRA 79.0%" in text
    assert "on qkv 1.00x to 1.00x; head only 0.10x" in text


def test_merge_and_transformer_and_qlora_paths(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg = small_cfg(evaluate=True)
    merged = lab.merge_comparison(cfg, rank=2)
    assert merged.max_output_diff.iloc[2] < 1e-4 and merged.lora_layers.tolist() == [0, 4, 0, 0]
    assert "the base timed twice differed by" in lab.merge_finding(merged)
    record = lab.transformer_finetune(cfg, rank=2, steps=2)
    assert record["peft_trainable"] == record["labkit_trainable"] > 0 and record["targets"] in ("query,value", "q_proj,v_proj")
    assert list((tmp_path / "models").glob("small_vit-*/config.json"))  # saved locally, loaded by from_pretrained
    qlora = lab.qlora_comparison(cfg, rank=2)
    rows = qlora.set_index("setup")
    if qlora.error.isna().all():
        assert 0.25 <= rows.base_weight_bytes.iloc[1] / rows.base_weight_bytes.iloc[0] < 0.32
    assert "frozen Linear weights" in lab.qlora_finding(qlora) or "did not run" in lab.qlora_finding(qlora)


def test_panel_run_and_own_numbers():
    run = lab.panel_run(lab.panel_config(small_cfg()).replace(lora_rank=2))
    assert run.to_row()["targets"] == "qkv" and run.num_trainable_params == 4 * lora.adapter_numel(128, 384, 2) + 1_546
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


def test_display_tables_and_the_chart_frame():
    import math

    import pandas as pd
    frame = pd.DataFrame({"setup": ["full fine-tune", "head only", "LoRA qkv r2", "LoRA qkv r8"],
                          "method": ["full fine-tune", "head only", "LoRA", "LoRA"], "rank": [0, 0, 2, 8],
                          "targets": ["-", "-", "qkv", "qkv"], "accuracy": [0.8, 0.5, 0.7, 0.75]})
    chart = lab.sweep_chart_frame(frame)
    assert sorted(chart.targets.unique()) == ["full fine-tune", "head only", "qkv"]
    assert chart[chart.targets == "full fine-tune"]["rank"].tolist() == [2, 8]  # flat across the LoRA ranks
    merged = pd.DataFrame({"setup": ["a", "b"], "latency_s": [0.01, 0.02], "vs_base": [1.0, 2.0],
                           "max_output_diff": [math.nan, 1e-6], "lora_layers": [0, 4]})
    assert lab.merge_table(merged)["largest output difference"].tolist() == ["-", "1.0e-06"]
    refused = pd.DataFrame({"setup": ["bf16 base", lab.NF4], "error": [None, "no bitsandbytes"]})
    assert list(lab.qlora_table(refused).columns) == ["setup", "error"]
