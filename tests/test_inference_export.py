"""`RunConfig`'s inference fields (prune_amount, prune_structured, quantize, quantize_keep_float) applied by `fit`."""

import pytest
import torch

import labkit
from labkit import choices, configfile, evaluation, train
from labkit.errors import ConfigError
from labkit.results import to_row
from labkit.techniques import quantization


def test_quantize_methods_have_one_home_that_the_config_and_the_technique_read():
    assert quantization.METHODS is choices.QUANTIZE_METHODS
    assert quantization.SIMULATED_METHODS is choices.SIMULATED_METHODS
    every = [*choices.QUANTIZE_METHODS, *choices.SIMULATED_METHODS]
    for method in every:
        assert labkit.RunConfig(quantize=method).quantize == method
    with pytest.raises(ConfigError, match=r"quantize='int2' is not allowed: None \(no quantization\) or one of") as bad:
        labkit.RunConfig(quantize="int2")
    with pytest.raises(ConfigError, match=r"method='int2' is not allowed: one of") as also_bad:
        quantization.quantize(torch.nn.Linear(4, 4), "int2")
    assert str(every) in str(bad.value) and str(every) in str(also_bad.value)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = labkit.RunConfig(model="small_cnn", batch_size=32, max_steps=6, train_size=192, pretrained=True)
    return cfg, labkit.fit(cfg, progress=False)


def test_unstructured_pruning_zeroes_weights_but_keeps_the_size(trained):
    cfg, res = trained
    info = evaluation.score_inference(res.model, cfg.replace(prune_amount=0.5), res_splits(cfg))
    assert info["method"] == "50% of weights zeroed"
    assert info["nonzero_share"] == pytest.approx(0.5, abs=0.01)
    assert info["size_bytes"] == res.model_size_bytes  # zeros are stored densely


def test_structured_pruning_rebuilds_a_smaller_model(trained):
    cfg, res = trained
    info = evaluation.score_inference(res.model, cfg.replace(prune_amount=0.5, prune_structured=True), res_splits(cfg))
    assert info["method"] == "50% of channels removed" and info["nonzero_share"] == pytest.approx(1.0, abs=0.01)
    assert info["size_bytes"] < 0.4 * res.model_size_bytes


def test_static_int8_shrinks_and_keeps_accuracy_near(trained):
    cfg, res = trained
    info = evaluation.score_inference(res.model, cfg.replace(quantize="int8_static"), res_splits(cfg))
    assert info["size_bytes"] < 0.35 * res.model_size_bytes and info["device"] == "cpu"
    assert abs(info["accuracy"] - res.accuracy) < 0.1


def test_simulated_bits_keep_the_size_and_the_kept_layers(trained):
    cfg, res = trained
    splits = res_splits(cfg)
    model = evaluation.inference_model(res.model, cfg.replace(quantize="int3_simulated", quantize_keep_float=["stem"]),
                                  splits["train"])
    before, after = dict(res.model.named_parameters()), dict(model.named_parameters())
    assert all((after[n] == before[n]).all() for n in before if n.startswith("stem.") and n.endswith("weight"))
    changed = [n for n in before if n.startswith("head.") and n.endswith("weight")]
    assert changed and all(not (after[n] == before[n]).all() for n in changed)
    assert len(set(after["head.2.weight"].flatten().tolist())) <= 8  # 3 bits: 8 levels
    info = evaluation.score_inference(res.model, cfg.replace(quantize="int3_simulated"), splits)
    assert info["size_bytes"] == res.model_size_bytes


def test_fit_records_the_deployed_copy_and_leaves_the_trained_model(trained):
    cfg, _ = trained
    res = labkit.fit(cfg.replace(prune_amount=0.3, quantize="int8_dynamic"), progress=False)
    assert res.inference["method"] == "30% of weights zeroed + int8_dynamic"
    assert 0 <= res.inference["accuracy"] <= 1 and res.inference["nonzero_share"] == pytest.approx(0.7, abs=0.01)
    assert labkit.techniques.pruning.sparsity(res.model).overall < 0.01  # the trained model is not pruned
    row = to_row(res)
    assert row["inference_size_bytes"] == res.inference["size_bytes"] and row["prune_amount"] == 0.3
    assert labkit.fit(cfg, progress=False).inference is None
    assert labkit.RunResult.from_dict(res.to_dict()).inference == res.inference


def res_splits(cfg):
    return train.run_splits(cfg)


@pytest.mark.parametrize("changes, field, allowed", [
    ({"prune_amount": 1.0}, "prune_amount", r"share in \(0, 1\)"),
    ({"prune_amount": "half"}, "prune_amount", r"share in \(0, 1\)"),
    ({"prune_structured": True}, "prune_structured", "unless prune_amount is set"),
    ({"prune_amount": 0.5, "prune_structured": "yes"}, "prune_structured", "True or False"),
    ({"quantize": "int2"}, "quantize", "int8_static"),
    ({"quantize_keep_float": ["head"]}, "quantize_keep_float", "unless quantize is set"),
    ({"quantize": "int8_static", "quantize_keep_float": [3]}, "quantize_keep_float", "module names"),
])
def test_bad_inference_fields_are_named(changes, field, allowed):
    with pytest.raises(ConfigError, match=rf"{field}.*{allowed}"):
        labkit.RunConfig(**changes)


def test_yaml_gives_a_keep_float_list_as_a_tuple(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("quantize: int8_static\nquantize_keep_float: [stem, head]\n")
    cfg = labkit.load_config(path)
    assert cfg.quantize_keep_float == ("stem", "head") and configfile.save_config(cfg, tmp_path / "b.yaml")
    assert labkit.load_config(tmp_path / "b.yaml") == cfg


def test_configs_that_differ_only_for_inference_train_once(trained, monkeypatch, tmp_path):
    from labkit import results

    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    cfg, _ = trained
    calls = []
    real_fit = results.fit
    monkeypatch.setattr(results, "fit", lambda c, **kw: calls.append(c) or real_fit(c, **kw))
    a = results.cached_fit(cfg.replace(quantize="int8_dynamic"), progress=False)
    b = results.cached_fit(cfg.replace(quantize="int8_static", prune_amount=0.3), progress=False)
    assert len(calls) == 1 and calls[0] == results.trained_config(cfg) == cfg
    assert a.step_time_s == b.step_time_s and a.inference["method"] != b.inference["method"]
    assert a.cfg.quantize == "int8_dynamic" and b.cfg.prune_amount == 0.3
