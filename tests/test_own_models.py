"""A learner's own model: a local folder, a hub id, torchvision:/timm: names, a module passed in; refusals named."""

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from own_fixtures import TINY, chats, model_dir, prompt_completion, write_jsonl

import labkit
from labkit import cli, models
from labkit.errors import ConfigError, UnsupportedError
from labkit.imagefolder import write_image_folder
from labkit.models import own
from labkit.models.hub import transformers_module
from labkit.models.language import decoder_layers, language_stages
from labkit.techniques.lora import lora_layers
from labkit.text import IGNORE_INDEX
from labkit.widgets import ExperimentPanel

# Parameters as published (the repos' safetensors metadata, their model cards): labkit's shipped configs must build
# exactly these models.
PUBLISHED_PARAMETERS = {"meta-llama/Llama-3.2-1B": 1_235_814_400, "Qwen/Qwen2.5-0.5B": 494_032_768,
                        "Qwen/Qwen2.5-7B": 7_615_616_512, "mistralai/Mistral-7B-v0.1": 7_241_732_096,
                        "google/gemma-2-2b": 2_614_341_888, "HuggingFaceTB/SmolLM2-135M": 134_515_008}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("own")


@pytest.fixture(scope="module")
def qwen(root):
    return model_dir(root, "Qwen/Qwen2.5-0.5B")


@pytest.fixture(scope="module")
def data(root):
    return {"pc": write_jsonl(root / "pc.jsonl", prompt_completion()),
            "chat": write_jsonl(root / "chat.jsonl", chats())}


def test_the_shipped_configs_build_the_published_models():
    assert sorted(PUBLISHED_PARAMETERS) == own.shipped_configs()
    for repo, count in PUBLISHED_PARAMETERS.items():
        with torch.device("meta"):
            model = transformers_module().AutoModelForCausalLM.from_config(own.model_config(repo))
        assert sum(p.numel() for p in model.parameters()) == count, repo


@pytest.mark.parametrize(("repo", "projections"), [
    ("meta-llama/Llama-3.2-1B", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("Qwen/Qwen2.5-0.5B", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("mistralai/Mistral-7B-v0.1", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("google/gemma-2-2b", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("HuggingFaceTB/SmolLM2-135M", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("phi3", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
    ("qwen3", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
])
def test_dense_decoders_are_found_from_their_module_tree(root, repo, projections):
    """No table per model: the layers, embeddings, output layer and LoRA's Linears of each family."""
    if "/" in repo:
        folder = own.write_config_dir(repo, root / repo.replace("/", "--"), **TINY, head_dim=16)
        config = own.model_config(str(folder))
    else:  # families labkit ships no config of: transformers' own defaults, shrunk
        config = transformers_module().AutoConfig.for_model(repo, **TINY, head_dim=16, pad_token_id=0, bos_token_id=1,
                                                            eos_token_id=2)
    model = transformers_module().AutoModelForCausalLM.from_config(config)
    model.labkit_name = str(root / repo)
    stages = language_stages(model)
    assert len(decoder_layers(model)) == 2 and [n for n, _ in stages] == ["embed", "layer0", "layer1", "head"]
    staged = {id(p) for _, stage in stages for p in stage.parameters()}
    assert staged == {id(p) for p in model.parameters()}  # every parameter in a stage
    labkit.techniques.lora.add_lora(model, 4, 16.0, "all-linear")
    adapted = {name.rsplit(".", 1)[-1] for name in lora_layers(model)}
    assert adapted == projections  # every projection, never the output layer
    assert not [p for n, p in model.named_parameters() if p.requires_grad and "lora" not in n]


def test_a_folder_of_a_qwen_config_trains_on_prompt_completion_with_lora(qwen, data):
    cfg = labkit.RunConfig(model=qwen, dataset=data["pc"], lora_rank=8, max_steps=6, batch_size=4, device="cpu")
    result = labkit.fit(cfg)
    assert result.weights == "random" and "NO PRETRAINED WEIGHTS" in result.warnings[0]
    assert result.data["shape"] == "prompt_completion" and result.data["loss_on"] == "completion"
    assert result.tokens_per_s > result.real_tokens_per_s > 0 and 0 <= result.pad_fraction < 1
    assert result.test_loss > 0 and result.perplexity == pytest.approx(2.718281828 ** result.test_loss)
    assert result.accuracy is None  # no task defines an exact match on a learner's data
    assert set(result.memory) >= {"parameters", "gradients", "optimizer_state", "activations"}
    assert 0 < result.num_trainable_params < result.num_params / 4  # the adapters only (a tiny model: 10 %)
    # the published config.json says bfloat16, which transformers 5 would build: labkit trains float32 weights
    assert json.loads((Path(qwen) / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {p.dtype for p in result.model.parameters()} == {torch.float32}


def test_a_llama_folder_with_weights_loads_them_and_trains_on_chats(root, data):
    folder = model_dir(root, "meta-llama/Llama-3.2-1B", template="plain")
    config = own.model_config(folder)
    transformers_module().AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    result = labkit.fit(labkit.RunConfig(model=folder, dataset=data["chat"], max_steps=6, batch_size=4, device="cpu"))
    assert result.weights == f"dir:{folder}" and not result.warnings
    assert result.data["loss_on"] == "assistant" and "found by labkit" in result.data["template"]


def test_the_cli_sweep_and_panel_take_a_folder_and_a_jsonl(qwen, data, tmp_path, capsys):
    path = tmp_path / "sft.yaml"
    path.write_text(f"model: {qwen}\ndataset: {data['pc']}\nlora_rank: 8\nmax_steps: 6\nmax_length: 64\n"
                    "per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\ndevice: cpu\n")
    assert cli.main(["run", str(path)]) == 0
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["data"]["loss_on"] == "completion" and payload["config"]["seq_len"] == 64
    assert cli.main(["sweep", str(path), "--set", "lora_rank=4,8"]) == 0
    header = capsys.readouterr().out.strip().splitlines()[0]
    assert "token throughput" in header and "test loss" in header
    shown = []
    panel = ExperimentPanel(labkit.fit, {"lora_rank": [4, 8]}, base=labkit.configfile.load_config(path),
                            show=shown.append, estimate=None)
    panel.click()
    assert shown and shown[-1].data["shape"] == "prompt_completion"


def test_a_module_and_records_passed_to_fit(qwen):
    tokenizer, _ = own.own_tokenizer(qwen)
    module = transformers_module().AutoModelForCausalLM.from_config(own.model_config(qwen))
    cfg = labkit.RunConfig(model=qwen, dataset="given", max_steps=6, batch_size=2, device="cpu")
    records = [{"prompt": f"{i} + 1 = ", "completion": str(i + 1)} for i in range(12)]
    result = labkit.fit(cfg, model=module, data=records, tokenizer=tokenizer.backend)
    assert result.weights == "given" and result.model is module and result.data["records"] == 12
    with pytest.raises(ConfigError, match=r"data=None is not allowed: records passed to fit"):
        labkit.fit(cfg)
    with pytest.raises(ConfigError, match=r"dataset='pydoc_text' is not allowed: 'given' when data is passed"):
        labkit.fit(cfg.replace(dataset="pydoc_text"), data=records)  # the records would be ignored
    with pytest.raises(ConfigError, match=r"data='a dict' is not allowed: a list of records"):
        labkit.fit(cfg, data=records[0], tokenizer=tokenizer.backend)


def test_a_hub_id_offline_uses_its_shipped_config_and_refuses_others():
    cfg = labkit.RunConfig(model="Qwen/Qwen2.5-0.5B", dataset="pydoc_text", pretrained=False)
    assert models.max_positions(cfg.model) == 32768 and models.is_language_model(cfg.model)
    tokenizer, why = own.own_tokenizer("Qwen/Qwen2.5-0.5B")
    assert tokenizer is None and "LABKIT_OFFLINE" in why
    with pytest.raises(ConfigError, match=r"model='someone/unknown-7b' is not allowed: a local directory with "
                                          r"config.json, or a hub id labkit ships the config of"):
        labkit.RunConfig(model="someone/unknown-7b", dataset="pydoc_text")


@pytest.mark.parametrize(("change", "match"), [
    ({"num_local_experts": 8}, r"its config sets num_local_experts=8: a mixture of experts"),
    ({"vision_config": {"hidden_size": 32}}, r"its config has vision_config: a multimodal model"),
    ({"architectures": ["BertForMaskedLM"], "model_type": "bert"},
     r"architectures=\['BertForMaskedLM'\]: an encoder"),
])
def test_moe_multimodal_and_encoder_configs_are_refused_naming_the_field(root, change, match):
    folder = own.write_config_dir("Qwen/Qwen2.5-0.5B", root / f"bad-{sorted(change)[0]}", **TINY, **change)
    with pytest.raises(ConfigError, match=match):
        labkit.RunConfig(model=str(folder), dataset="pydoc_text")


def test_seq_len_above_the_models_maximum_is_refused(root, data):
    folder = own.write_config_dir("Qwen/Qwen2.5-0.5B", root / "short", **TINY, max_position_embeddings=32)
    with pytest.raises(ConfigError, match=r"seq_len=64 is not allowed: at most 32, the longest sequence"):
        labkit.RunConfig(model=str(folder), dataset=data["pc"], seq_len=64)
    assert labkit.train.run_splits(labkit.RunConfig(model=str(folder), dataset=data["pc"], batch_size=4))[
        "train"].seq_len == 32  # the default: 1024, at most the model's max_position_embeddings


def test_own_data_fields_are_refused_on_labkits_datasets(qwen):
    with pytest.raises(ConfigError, match=r"loss_on='all' is not allowed: None \(the default\) for digits_sort"):
        labkit.RunConfig(model=qwen, dataset="digits_sort", loss_on="all")


def test_torchvision_models_on_an_image_folder(root):
    folder = str(write_image_folder(root / "shapes", per_class=6))
    result = labkit.fit(labkit.RunConfig(model="torchvision:resnet18", dataset=folder, batch_size=8, max_steps=6,
                                         device="cpu"))
    assert result.weights == "random" and result.accuracy is not None
    assert result.model.fc.out_features == 10  # the head sized for the folder's classes
    with pytest.raises(ConfigError, match=r"model='torchvision:resnet1800' is not allowed: torchvision:NAME with a "
                                          r"model torchvision knows"):
        labkit.RunConfig(model="torchvision:resnet1800", dataset=folder)
    with pytest.raises(ConfigError, match=r"dataset='.*shapes' is not allowed: one of \[.*digits_sort.*\] or a text "
                                          r"data file: .* is a language model"):
        labkit.RunConfig(model="tiny_llama", dataset=folder)


def test_timm_models_by_name_when_timm_is_there(monkeypatch, root):
    monkeypatch.setitem(sys.modules, "timm", None)  # not installed
    with pytest.raises(UnsupportedError, match="timm is not installed"):
        labkit.RunConfig(model="timm:resnet10t", dataset="shapes10")
    fake = types.SimpleNamespace(list_models=lambda: ["resnet10t"],
                                 create_model=lambda name, pretrained=False: models.SmallCNN(7))
    monkeypatch.setitem(sys.modules, "timm", fake)
    model, weights = models.build("timm:resnet10t", num_classes=3, pretrained=False)
    assert weights.source == "random" and model(torch.zeros(2, 3, 32, 32)).shape == (2, 3)


def test_the_cache_tells_one_folder_from_another(root, data, tmp_path):
    from labkit.results import files_fingerprint

    cfg = labkit.RunConfig(model="tiny_llama", dataset=data["pc"])
    before = files_fingerprint(cfg)
    (tmp_path / "pc.jsonl").write_text(open(data["pc"]).read())
    assert files_fingerprint(cfg.replace(dataset=str(tmp_path / "pc.jsonl"))) != before


def test_labels_of_a_chat_keep_the_system_and_user_turns_out(qwen, data):
    split = labkit.train.run_splits(labkit.RunConfig(model=qwen, dataset=data["chat"], batch_size=4))["train"]
    tokenizer = split.tokenizer
    pairs = zip(split.input_ids[0].tolist(), split.labels[0].tolist(), strict=True)
    trained = tokenizer.decode([i for i, label in pairs if label != IGNORE_INDEX], skip_special_tokens=False)
    assert "Answer in one word" not in trained and trained.count("<|im_end|>") == 2


def test_online_a_hub_id_downloads_its_config_tokenizer_and_weights_at_its_revision(monkeypatch, qwen, data):
    """The Colab path, with the hub faked: config, tokenizer and weights asked for at the revision given."""
    transformers, calls = transformers_module(), []
    local_tokenizer = transformers.AutoTokenizer.from_pretrained(qwen)
    config = own.model_config(qwen)

    def fake(kind, returned):
        def from_pretrained(source, revision=None, **kwargs):
            calls.append((kind, source, revision))
            return returned()
        return from_pretrained

    monkeypatch.setattr(own, "is_online", lambda: True)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", fake("config", lambda: config))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake("tokenizer", lambda: local_tokenizer))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        fake("weights", lambda: transformers.AutoModelForCausalLM.from_config(config)))
    own.model_config.cache_clear()
    cfg = labkit.RunConfig(model="Qwen/Qwen2.5-0.5B@0123abc", dataset=data["pc"], max_steps=6, batch_size=4,
                           device="cpu", evaluate=False)
    result = labkit.fit(cfg)
    assert result.weights == "hub:Qwen/Qwen2.5-0.5B" and not result.warnings
    assert calls == [("config", "Qwen/Qwen2.5-0.5B", "0123abc"), ("tokenizer", "Qwen/Qwen2.5-0.5B", "0123abc"),
                     ("weights", "Qwen/Qwen2.5-0.5B", "0123abc")]
    own.model_config.cache_clear()


def test_gemma_2s_softcapping_is_never_dropped_silently(root, data, monkeypatch):
    folder = model_dir(root, "google/gemma-2-2b", head_dim=16)
    cfg = labkit.RunConfig(model=folder, dataset=data["pc"], max_steps=6, batch_size=4, seq_len=64, device="cpu",
                           evaluate=False, pretrained=False)
    gemma = transformers_module().AutoModelForCausalLM._model_mapping[type(own.model_config(folder))]
    for sdpa in (False, True):  # transformers 5.24 has no SDPA attention for Gemma 2; some releases ran it uncapped
        monkeypatch.setattr(gemma, "_supports_sdpa", sdpa)
        if not sdpa:
            with pytest.raises(ConfigError, match=r"attn_implementation='sdpa' is not allowed: 'eager' for .*no "
                                                  r"SDPA attention for Gemma2ForCausalLM .*softcapping=50.0"):
                labkit.fit(cfg)
            continue
        # where a transformers release runs it on SDPA, labkit says the cap is left out
        monkeypatch.setattr(labkit.kinds.language.models, "build_language_model",
                            lambda *args: (transformers_module().AutoModelForCausalLM.from_config(
                                own.model_config(folder), attn_implementation="eager"), models.WeightsInfo("random")))
        warnings = labkit.fit(cfg).warnings
        assert any(w.startswith("ATTENTION NOT CAPPED") and "attn_logit_softcapping=50.0" in w for w in warnings)
    monkeypatch.undo()
    eager = cfg.replace(attn_implementation="eager")
    assert not labkit.fit(eager).warnings
    with pytest.raises(ConfigError, match=r"loss_chunks=2 is not allowed: None for .*final_logit_softcapping=30.0"):
        labkit.fit(eager.replace(loss_chunks=2))


@pytest.mark.parametrize("changes", [
    {"packing": "pack"}, {"packing": "pad_max", "loss_chunks": 4}, {"checkpointing": True},
    {"optimizer": "adamw8bit"}, {"precision": "bf16"}, {"freeze": "head_only"}, {"attn_implementation": "eager"},
    {"gradient_accumulation_steps": 2, "optim": "adamw_torch_fused"},
])
def test_the_lab_techniques_run_on_a_learners_model_and_chats(qwen, data, changes):
    """Each technique the notebooks teach, on a learner-shaped model and chat data (the ladder of issue 42)."""
    if changes.get("optimizer") == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    cfg = labkit.RunConfig(model=qwen, dataset=data["chat"], max_steps=6, batch_size=4, seq_len=128, device="cpu",
                           **changes)
    result = labkit.fit(cfg)
    assert result.test_loss > 0 and all(math.isfinite(loss) for loss in result.losses)
    assert result.data["loss_on"] == "assistant"
