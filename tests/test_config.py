import ast
import math
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

import labkit
from labkit import choices, config, fieldchecks, models, text
from labkit.config import baseline
from labkit.configfile import load_config, save_config
from labkit.errors import ConfigError


def test_defaults_are_valid_and_replace_validates():
    cfg = labkit.RunConfig()
    assert cfg.model == "small_cnn" and cfg.precision == "fp32" and cfg.grad_accum == 1
    assert cfg.replace(batch_size=128).batch_size == 128
    with pytest.raises(ConfigError, match=r"batch_size=0 is not allowed: a positive integer"):
        cfg.replace(batch_size=0)


@pytest.mark.parametrize("field, value, match", [
    ("model", "resnet9000", r"model='resnet9000' is not allowed: one of \[.*small_cnn"),
    ("dataset", "imagenet", r"dataset='imagenet' is not allowed: one of \[.*shapes10"),
    ("batch_size", 0, r"batch_size=0 is not allowed: a positive integer"),
    ("batch_size", -8, r"batch_size=-8 is not allowed: a positive integer"),
    ("batch_size", 32.5, r"batch_size=32.5 is not allowed: a positive integer"),
    ("batch_size", True, r"batch_size=True is not allowed"),
    ("lr", 0, r"lr=0 is not allowed: a finite number > 0"),
    ("lr", -1e-3, r"lr=-0.001 is not allowed: a finite number > 0"),
    ("precision", "fp8", r"precision='fp8' is not allowed: one of \['fp32', 'fp16', 'bf16', 'auto'\]"),
    ("grad_accum", 0, r"grad_accum=0 is not allowed: a positive integer"),
    ("optimizer", "lion",
     r"optimizer='lion' is not allowed: one of \['adamw', 'sgd', 'adamw8bit', 'paged_adamw8bit'\]"),
    ("device", "tpu", r"device='tpu' is not allowed"),
    ("grad_clip", 0, r"grad_clip=0 is not allowed: None or a finite number > 0"),
    ("max_steps", 0, r"max_steps=0 is not allowed: None or a positive integer"),
    ("checkpointing", 0, r"checkpointing=0 is not allowed: False, True \(every block its own segment\) or an "
                         r"integer >= 1 \(the number of checkpointed segments\)\. checkpointing=False turns it off"),
    ("checkpointing", -1, r"checkpointing=-1 is not allowed: False, True .* or an integer >= 1"),
    ("checkpointing", 2.0, r"checkpointing=2.0 is not allowed: False, True .* or an integer >= 1"),
    ("checkpointing", "all", r"checkpointing='all' is not allowed: False, True .* or an integer >= 1"),
    ("checkpointing", 5, r"checkpointing=5 is not allowed: False, True or 1 to 4: small_cnn has 4 blocks "
                         r"\(stem, block1, block2, block3\), and a segment holds at least one"),
    ("freeze", "full", r"freeze='full' is not allowed: None or one of \['none', 'light', 'medium', 'heavy', "
                       r"'head_only'\] \('head_only': only the head trains\)"),
    ("freeze", ["stem"], r"freeze=\['stem'\] is not allowed: None or one of"),
    ("pretrained", "yes", r"pretrained='yes' is not allowed: True or False"),
    ("lr", float("nan"), r"lr=nan is not allowed: a finite number > 0"),
    ("lr", float("inf"), r"lr=inf is not allowed"),
    ("weight_decay", float("nan"), r"weight_decay=nan is not allowed: a finite number >= 0"),
    ("lr_warmup_steps", -1, r"lr_warmup_steps=-1 is not allowed: an integer >= 0 \(0: no warm-up\)"),
    ("lr_warmup_steps", 2.5, r"lr_warmup_steps=2.5 is not allowed: an integer >= 0"),
    ("lr_warmup_steps", True, r"lr_warmup_steps=True is not allowed: an integer >= 0"),
])
def test_bad_values_name_field_value_and_allowed(field, value, match):
    with pytest.raises(ConfigError, match=match):
        labkit.RunConfig(**{field: value})


def test_checkpointing_accepts_bools_and_segment_counts_up_to_the_models_blocks():
    assert labkit.RunConfig(checkpointing=True).checkpointing is True
    assert labkit.RunConfig(checkpointing=4).checkpointing == 4
    assert labkit.RunConfig(model="resnet18", checkpointing=5).checkpointing == 5
    with pytest.raises(ConfigError, match=r"checkpointing=6 is not allowed: False, True or 1 to 5: resnet18 has 5 "
                                          r"blocks \(stem, layer1, layer2, layer3, layer4\)"):
        labkit.RunConfig(model="resnet18", checkpointing=6)


def test_freeze_accepts_none_and_every_level():
    assert labkit.RunConfig().freeze is None
    for level in ("none", "light", "medium", "heavy", "head_only"):
        assert labkit.RunConfig(freeze=level).freeze == level


def test_8bit_optimizers_have_no_momentum_setting():
    assert labkit.RunConfig(optimizer="adamw8bit").optimizer == "adamw8bit"
    with pytest.raises(ConfigError, match=r"momentum=0.5 is not allowed: 0.9 \(the default\) unless optimizer='sgd'. "
                                          r"paged_adamw8bit has no momentum setting"):
        labkit.RunConfig(optimizer="paged_adamw8bit", momentum=0.5)


def test_grad_accum_must_divide_batch():
    with pytest.raises(ConfigError, match=r"grad_accum=3 is not allowed: a divisor of batch_size=64"):
        labkit.RunConfig(batch_size=64, grad_accum=3)
    assert labkit.RunConfig(batch_size=64, grad_accum=4).grad_accum == 4


def test_unknown_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match=r"RunConfig key='batchsize' is not allowed.*Did you mean 'batch_size'"):
        labkit.RunConfig().replace(batchsize=3)


def test_yaml_round_trip(tmp_path):
    cfg = labkit.RunConfig(batch_size=32, precision="bf16", lr=3e-4, max_steps=10, lr_warmup_steps=3)
    path = save_config(cfg, tmp_path / "run.yaml")
    assert load_config(path) == cfg


def test_yaml_unknown_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"batch_size": 32, "learnig_rate": 0.1}))
    with pytest.raises(ConfigError, match=r"bad.yaml key='learnig_rate' is not allowed: a RunConfig field .* or an "
                                          r"alias of one .*Did you mean 'learning_rate'"):
        load_config(path)


def test_the_names_users_bring_from_trl_peft_and_the_hf_trainer(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("model: tiny_llama\ndataset: digits_sort\nmax_length: 64\nper_device_train_batch_size: 4\n"
                    "gradient_accumulation_steps: 8\ngradient_checkpointing: true\noptim: adamw_torch_fused\n"
                    "learning_rate: 2.0e-4\nlora_rank: 8\ntarget_modules: [q_proj, v_proj]\nbf16: true\n")
    cfg = load_config(path)
    # per_device_train_batch_size is the micro-batch: 4 rows x 8 accumulation steps = 32 rows a step
    assert (cfg.seq_len, cfg.batch_size, cfg.grad_accum, cfg.checkpointing) == (64, 32, 8, True)
    assert (cfg.optimizer, cfg.optimizer_impl, cfg.lr, cfg.precision) == ("adamw", "fused", 2e-4, "bf16")
    assert cfg.lora_targets == ("q_proj", "v_proj")
    assert labkit.RunConfig(optim="adamw_8bit").optimizer == "adamw8bit"
    assert labkit.RunConfig(optimizer="paged_adamw_8bit").optimizer == "paged_adamw8bit"
    assert cfg.replace(max_length=32).seq_len == 32
    assert labkit.RunConfig(fp16=False).precision == "fp32"


@pytest.mark.parametrize(("values", "match"), [
    ({"lr": 1e-3, "learning_rate": 2e-3}, r"key='learning_rate' is not allowed: one name for lr: 'lr' names it too"),
    ({"optim": "adamw_torch_fused", "optimizer_impl": "foreach"},
     r"optimizer_impl='foreach' is not allowed: 'fused' or unset with optim='adamw_torch_fused'"),
    ({"optim": "lion"}, r"optimizer='lion' is not allowed: one of .* \(or transformers' optim names .*adamw_8bit"),
    ({"bf16": "yes"}, r"bf16='yes' is not allowed: True or False"),
    ({"bf16": True, "fp16": True}, r"key='fp16' is not allowed: one name for precision: 'bf16' names it too"),
])
def test_aliases_refuse_two_names_for_one_field(values, match):
    with pytest.raises(ConfigError, match=match):
        labkit.RunConfig(**values)


def test_each_field_states_its_check_and_what_it_depends_on_where_it_is_declared():
    described = {f.name: f.metadata for f in fields(labkit.RunConfig)}
    assert all("check" in meta for meta in described.values())  # declared with `option`, none left bare
    assert described["lora_alpha"]["needs"] is fieldchecks.LORA
    assert described["seq_len"]["needs"] is fieldchecks.LANGUAGE
    assert config.LORA_DEFAULTS == {"lora_alpha": 16.0, "lora_targets": "all-linear", "lora_dropout": 0.0}


def test_no_choice_is_restated_outside_its_home():
    """A choice's values written out again (a list of packings in a lab, a notebook's panel) drift from their home."""
    homes = {"choices": [choices.PRECISIONS, choices.OPTIMIZERS, choices.EIGHT_BIT_OPTIMIZERS, choices.FREEZE_LEVELS,
                         choices.PACKINGS, choices.ATTN_IMPLEMENTATIONS, choices.OPTIMIZER_IMPLS,
                         choices.COMPILE_PACKINGS, tuple(choices.QUANTIZE_METHODS)],
             "tasks": [text.TEXT_DATASETS], "language": [tuple(models.LANGUAGE_MODELS)],
             "hub": [tuple(models.HUB_MODELS)]}
    root = Path(labkit.__file__).parents[2]
    files = [*(root / "src/labkit").rglob("*.py"), *(root / "notebooks/src").glob("[0-9]*.py")]
    restated = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)):
                continue
            values = {e.value for e in node.elts}
            restated += [f"{path.relative_to(root)}:{node.lineno} {sorted(values)}" for home, choices_here in
                         homes.items() for values_home in choices_here
                         if values == set(values_home) and path.stem != home]
    assert not restated, f"choices written out again instead of imported from their home: {restated}"


def test_yaml_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"list.yaml='list' is not allowed: a YAML mapping"):
        load_config(path)


def test_yaml_bad_value_is_validated(tmp_path):
    path = tmp_path / "zero.yaml"
    path.write_text("batch_size: 0\n")
    with pytest.raises(ConfigError, match="batch_size=0"):
        load_config(path)


def test_empty_yaml_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == labkit.RunConfig()


def test_baseline_follows_profile():
    cfg = baseline(labkit.profile("quick"), batch_size=32)
    assert cfg.max_steps == labkit.profile("quick").max_steps and cfg.batch_size == 32 and cfg.pretrained
    with pytest.raises(ConfigError, match="baseline key='bs'"):
        baseline(bs=3)


def test_fields_that_would_be_ignored_are_errors():
    with pytest.raises(ConfigError, match=r"epochs=3 is not allowed: 1 \(the default\) when max_steps is set"):
        labkit.RunConfig(epochs=3, max_steps=10)
    with pytest.raises(ConfigError, match=r"momentum=0.5 is not allowed: 0.9 \(the default\) unless optimizer='sgd'"):
        labkit.RunConfig(optimizer="adamw", momentum=0.5)
    assert labkit.RunConfig(optimizer="sgd", momentum=0.5).momentum == 0.5


def test_yaml_reads_exponent_floats(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 5e-4\n")
    cfg = load_config(path)
    assert cfg.lr == 0.001 and cfg.weight_decay == 0.0005


def test_malformed_yaml_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("batch_size: [32\n")
    with pytest.raises(ConfigError, match=r"broken.yaml=.* is not allowed: valid YAML"):
        load_config(path)


# The profile's workload


def test_ci_and_quick_keep_the_small_offline_workload():
    assert config.workload(labkit.profile("quick")) == config.SMALL_WORKLOAD
    assert config.workload(labkit.profile("ci")) == {**config.SMALL_WORKLOAD, "batch_size": 32}  # CI's time
    cfg = baseline(labkit.profile("ci"))
    assert (cfg.model, cfg.dataset, cfg.image_size, cfg.batch_size) == ("small_cnn", "shapes10", None, 32)
    assert baseline(labkit.profile("quick")).batch_size == 64


def test_full_fine_tunes_a_pretrained_resnet_on_upsampled_cifar10_when_online(monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    monkeypatch.setattr(config.downloads, "host_answers", lambda host: True)  # CIFAR-10's host answers
    cfg = baseline(labkit.profile("full"))
    assert (cfg.model, cfg.dataset, cfg.image_size, cfg.batch_size) == ("resnet18", "cifar10", 128, 128)
    assert cfg.pretrained and cfg.max_steps == labkit.profile("full").max_steps


def test_full_offline_falls_back_to_the_small_workload_loudly(capsys):
    cfg = baseline(labkit.profile("full"))  # the tests run with LABKIT_OFFLINE=1
    assert (cfg.model, cfg.dataset, cfg.image_size) == ("small_cnn", "shapes10", None)
    printed = " ".join(capsys.readouterr().out.split())
    assert printed.startswith("labkit note: WARNING: the full profile's workload (resnet18 on cifar10 at 128x128) "
                              "needs the network")
    assert "bound by kernel launches" in printed


def test_image_size_is_validated():
    with pytest.raises(ConfigError, match=r"image_size=8 is not allowed: None \(the dataset's own size\) or an "
                                          r"integer >= 16"):
        labkit.RunConfig(image_size=8)


def test_the_full_workload_runs_on_the_cpu_at_reduced_size():
    # ResNet-18 fine-tuned on upsampled images, as at `full`, on 32 images at 64x64 instead of CIFAR-10 at 128.
    small = labkit.RunConfig(model="resnet18", dataset="shapes10", batch_size=8, max_steps=4, train_size=32,
                             pretrained=False, evaluate=False, device="cpu")
    native = labkit.fit(small, progress=False)
    upsampled = labkit.fit(small.replace(image_size=64), progress=False)
    assert upsampled.flops_per_step / native.flops_per_step == pytest.approx(4.0, rel=0.15)  # 2x the side
    assert all(math.isfinite(loss) for loss in upsampled.losses)
