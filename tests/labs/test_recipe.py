"""Notebook 09's lab: the staged recipe, the measured order, the profiled step and the summary of 01-08."""

import json

import pandas as pd
import pytest

import labkit
from labkit import results
from labkit.errors import ConfigError
from labkit.labs import recipe as lab
from labkit.labs.recipe.language import LmRecipe
from labkit.labs.recipe.panel import DOCTOR_STEPS
from labkit.labs.recipe.profiler import operator_rows
from labkit.labs.recipe.stages import GIVEN, MEASURED, STAGE_COLUMNS, Stage, changes_nothing, measured_order
from labkit.labs.recipe.summary import Summary
from labkit.result import RunResult
from labkit.techniques.optimizers import scale_lr


@pytest.fixture
def base():
    return labkit.RunConfig(model="small_cnn", batch_size=32, epochs=2, train_size=192, device="cpu")


@pytest.fixture
def small_recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("batch_size: 64\ncheckpointing: true\nfreeze: medium\nquantize: int8_dynamic\n"
                    "quantize_keep_float: []\n")
    return path


def test_the_shipped_recipe_loads_as_a_run_config_with_its_stages_in_file_order():
    assert lab.RECIPE_PATH.name == "staged_recipe.yaml"
    cfg = labkit.load_config(lab.RECIPE_PATH)
    stages = lab.recipe_stages()
    assert [s.key for s in stages] == ["batch_size", "precision", "optimizer", "freeze", "quantize"]
    assert all(getattr(cfg, s.key) == s.changes[s.key] for s in stages)
    assert stages[-1].inference and not any(s.inference for s in stages[:-1])
    # 02's lessons travel with the larger batch: a learning rate scaled by the square-root rule, and a warm-up
    assert stages[0].label() == "larger batch (batch_size=256, lr=0.002, lr_warmup_steps=2)"
    assert cfg.lr == pytest.approx(scale_lr(lab.workload(labkit.profile("ci")).lr, 256, 64, "sqrt"))
    assert not cfg.checkpointing  # memory is not the limit of this workload (03)


def test_a_stage_carries_the_fields_that_belong_to_it(small_recipe):
    stages = lab.recipe_stages(small_recipe)
    assert [s.key for s in stages] == ["batch_size", "checkpointing", "freeze", "quantize"]
    assert stages[-1].changes == {"quantize": "int8_dynamic", "quantize_keep_float": ()}


@pytest.mark.parametrize("text, match", [
    ("batch_sise: 64\n", "batch_sise"),
    ("lora_targets: [qkv]\n", "lora_targets.*unless lora_rank is set"),
    ("", "at least one RunConfig field"),
])
def test_bad_recipes_are_named(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        lab.recipe_stages(path)


def test_staged_stacks_each_stage_on_the_ones_before(base, small_recipe):
    rec = lab.staged(base, small_recipe, progress=False)
    assert list(rec.given.stage) == [0, 1, 2, 3, 4] and rec.given.error.isna().all()
    last = rec.given.iloc[-1]
    assert (last.batch_size, last.checkpointing, last.freeze, last.quantize) == (64, True, "medium", "int8_dynamic")
    alone = rec.alone.set_index("stage")
    assert alone.loc[2].checkpointing and alone.loc[2].batch_size == 32  # alone: on the baseline only
    assert rec.given.iloc[0].step_time_s == rec.alone.iloc[0].step_time_s == rec.measured.iloc[0].step_time_s
    assert rec.order[-1].key == "quantize" and {s.key for s in rec.order} == {s.key for s in rec.stages}
    assert rec.given.iloc[-1].deployed_size_bytes < rec.given.iloc[-2].deployed_size_bytes  # int8 Linear head
    assert rec.given.epoch_time_s.gt(0).all() and rec.given.deployed_accuracy.between(0, 1).all()
    table = rec.frame
    assert len(table) == 10 and list(table.columns) == list(STAGE_COLUMNS)
    assert table.order.tolist() == [GIVEN] * 5 + [MEASURED] * 5
    assert table.model_size_bytes.iloc[4] == rec.given.deployed_size_bytes.iloc[4]  # the deployed model's
    assert (table.epoch_time_p10_s <= table.epoch_time_s).all() and (table.epoch_time_s <= table.epoch_time_p90_s).all()
    assert len(rec.each_alone) == 5 and rec.each_alone.frame.model_size_bytes.iloc[4] == \
        rec.alone.deployed_size_bytes.iloc[4]
    assert rec.whole_time().ratio == pytest.approx(last.epoch_time_s / rec.given.iloc[0].epoch_time_s)
    assert rec.whole_time().band[0] <= rec.whole_time().ratio <= rec.whole_time().band[1]  # both runs' spreads
    text = rec.finding()
    assert text.startswith("The whole recipe: epoch time") and "\n" not in text
    assert all(len(line) <= 100 for line in str(text).splitlines())  # printed wrapped
    assert rec.each_alone.finding().startswith("Measured order: ")
    assert "Measured order: " in repr(rec.each_alone) and "The whole recipe" in rec._repr_html_()
    with pytest.raises(ConfigError, match="the training stages"):
        rec.own_stack_numbers()  # the exercise needs the shipped recipe's four training stages


def test_measured_order_ranks_by_memory_times_time_and_keeps_inference_last():
    stages = [Stage("a", {"batch_size": 128}), Stage("q", {"quantize": "fp16"}),
              Stage("b", {"freeze": "heavy"}), Stage("c", {"checkpointing": True})]
    alone = pd.DataFrame({"peak_memory_bytes": [100, 150, 100, 40, 60], "epoch_time_s": [1.0, 0.8, 0.5, 0.9, 1.2],
                          "error": [None, None, None, None, None]})
    assert [s.name for s in measured_order(stages, alone)] == ["b", "c", "a", "q"]  # 0.36, 0.72, 1.2; q last
    alone.loc[3, "error"] = "RuntimeError: out of memory"
    assert [s.name for s in measured_order(stages, alone)] == ["c", "a", "b", "q"]


def test_a_precision_that_resolves_to_the_baselines_changes_nothing_and_goes_last():
    stages = [Stage("amp", {"precision": "auto"}), Stage("freeze", {"freeze": "medium"}),
              Stage("bf16", {"precision": "bf16"})]
    alone = pd.DataFrame({"peak_memory_bytes": [100, 100, 50, 60], "epoch_time_s": [1.0, 0.9, 0.6, 1.5],
                          "precision_used": ["fp32", "fp32", "fp32", "bf16"], "error": [None] * 4})
    assert changes_nothing(stages[0], alone.iloc[1], alone.iloc[0])  # 0.9x is noise: the same computation
    assert not changes_nothing(stages[2], alone.iloc[3], alone.iloc[0])
    assert [s.name for s in measured_order(stages, alone)] == ["freeze", "bf16", "amp"]


def test_the_profiled_step_names_operators_by_kind_and_writes_a_trace(base):
    pair = lab.profile_pair(base.replace(epochs=1, max_steps=8))
    before, after = pair.before, pair.after
    assert before.precision == "fp32" and after.precision == lab.profiler_precision(base) == "bf16"
    assert len(before.ops) == lab.PROFILE_TOP and before.ops.self_ms.is_monotonic_decreasing
    assert before.kinds.share.sum() == pytest.approx(1.0) and before.kinds.kind.iloc[0] == "matmul / convolution"
    trace = json.loads(before.trace_path.read_text())
    assert trace["traceEvents"] and before.trace_path.name.endswith("fp32-cpu.json")
    assert after.ops.operator.str.contains("_to_copy|copy_").any()
    text = pair.finding()
    assert text.startswith("One profiled step (cpu): fp32") and "bf16" in text and "\n" not in text
    assert "ms: " in text and "x (no spread measured);" in text  # one step each: no spread
    kinds = pair.frame
    assert set(pair.long().precision) == {"fp32", "bf16"} and "kind" in pair.text()
    assert list(kinds.columns) == ["kind", "fp32_self_ms", "bf16_self_ms", "fp32_share", "bf16_share"]
    assert kinds.fp32_share.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("name, kind", [("aten::convolution_backward", "matmul / convolution"),
                                        ("aten::addmm", "matmul / convolution"), ("aten::_to_copy", "copies and casts"),
                                        ("Optimizer.step#AdamW.step", "optimizer"),
                                        ("aten::relu_", "elementwise / activation"),
                                        ("aten::native_batch_norm", "normalization"), ("aten::empty", "other")])
def test_op_kinds(name, kind):
    assert lab.op_kind(name) == kind


def _write(result: RunResult):
    key = results.cache_key(result.cfg, result.env)
    results.write_json_atomic(results.results_dir() / f"{key}.json", result.to_dict())


def _run(cfg, step_time_s, peak, accuracy, **extra):
    env = labkit.env_report(cfg.device)
    return RunResult(config=cfg.to_dict(), env=env, step_time_s=step_time_s, throughput=cfg.batch_size / step_time_s,
                     peak_memory_bytes=peak, accuracy=accuracy, model_size_bytes=1000, **extra)


def test_the_summary_pairs_each_technique_with_its_run_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    prof = labkit.profile()
    cfg = labkit.config.baseline(prof)
    _write(_run(cfg, 0.10, 1000, 0.70, step_time_p10_s=0.09, step_time_p90_s=0.11))
    _write(_run(cfg.replace(freeze="medium"), 0.05, 400, 0.69, step_time_p10_s=0.045, step_time_p90_s=0.055))
    _write(_run(cfg.replace(checkpointing=True), 0.13, 800, 0.70, step_time_p10_s=0.08, step_time_p90_s=0.16))
    _write(_run(cfg.replace(checkpointing=True, freeze="heavy"), 0.04, 300, 0.6))  # a second freezing pair
    results.write_json_atomic(results.results_dir() / "quant-compare-x.json", {"frame": pd.DataFrame({
        "model": [cfg.model] * 2, "method": ["fp32", "int8_static"], "ran": [True, True],
        "cpu_latency_s": [0.02, 0.005], "model_size_bytes": [1200, 320],
        "test_accuracy": [0.70, 0.69]}).to_json(orient="split")})
    frame = lab.summary(prof).frame.set_index("technique")
    freeze = frame.loc["freezing"]
    assert freeze.pairs == 2 and freeze.time_ratio == pytest.approx(0.5) and freeze.memory_ratio == pytest.approx(0.4)
    assert freeze.accuracy_change == pytest.approx(-0.01) and "freeze=medium" in freeze.setting
    assert frame.loc["gradient checkpointing"].time_ratio == pytest.approx(1.3)
    assert freeze.time_beyond_spread is True and frame.loc["gradient checkpointing"].time_beyond_spread is False
    quant = frame.loc["int8 quantization"]
    assert quant.time_ratio == pytest.approx(0.25) and quant.size_ratio == pytest.approx(320 / 1200)
    assert quant.time_basis == "CPU inference latency"
    assert frame.loc["LoRA"].pairs == 0 and frame.loc["mixed precision"].pairs == 0
    assert list(frame.notebook) == sorted(frame.notebook)
    text = Summary(frame.reset_index()).finding()
    assert text.startswith("Most saved here, time: 06 int8 quantization (0.25x)") and "\n" not in text
    assert "not run yet on this machine" in text and "08 LoRA" in text


def test_reference_rows_give_amps_published_speedup_as_a_time_ratio():
    ref = lab.reference_rows()
    assert sorted(ref.time_ratio.round(3)) == [0.333, 0.5] and ref.source.str.startswith("published").all()
    assert ref.citation.str.contains("Automatic Mixed Precision").all()


def test_broken_configs_and_the_panel(base):
    assert lab.broken(base, "nan_loss").lr == 50.0 and lab.broken(base, "pruning_memory").prune_amount == 0.5
    with pytest.MonkeyPatch.context() as env:  # at full the doctor's runs stop at DOCTOR_STEPS (09 within 15 min)
        env.setenv("LABKIT_PROFILE", "full")
        assert lab.broken(base, "nan_loss").max_steps == DOCTOR_STEPS < labkit.profile().max_steps
        assert lab.doctor_config(base).epochs == 1
    assert lab.broken(base, "nan_loss").max_steps == min(labkit.profile().max_steps, DOCTOR_STEPS)
    with pytest.raises(ConfigError, match="symptom"):
        lab.broken(base, "slow")
    cfg = lab.panel_config(base)
    assert cfg.quantize == "int8_static" and cfg.freeze == "medium" and cfg.batch_size == 256
    with labkit.machine.described("cpu_avx2"):  # precision "auto": fp32 where bf16 would be emulated
        run = lab.panel_run(lab.panel_config(base).replace(batch_size=64))
    assert run.model_size_bytes < 0.4 * 1.2e6 and 0 <= run.accuracy <= 1 and "int8_static" in str(run)
    assert run.setting == "bs64 fp32 8bit freeze medium int8_static" and run.to_row()["setting"] == run.setting


def test_summary_finding_names_a_time_saving_only_beyond_the_runs_spread():
    frame = pd.DataFrame({"label": ["03 gradient checkpointing", "05 freezing"], "pairs": [1, 1],
                          "time_ratio": [0.4, 0.8], "time_beyond_spread": [False, True],
                          "memory_ratio": [1.0, 0.5], "size_ratio": [1.0, 1.0]})
    assert Summary(frame).finding() == "Most saved here, time: 05 freezing (0.80x); peak memory: 05 freezing (0.50x)."


def test_a_gpu_profile_counts_each_kernel_once():
    from types import SimpleNamespace

    import torch

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(key, kind, self_us):
        return SimpleNamespace(key=key, count=1, device_type=kind, self_device_time_total=self_us,
                               device_time_total=self_us, self_cpu_time_total=5.0, cpu_time_total=5.0)

    events = [event("aten::mm", cpu, 300.0), event("sm80_xmma_gemm_f32f32", cuda, 300.0),
              event("aten::relu", cpu, 100.0), event("void elementwise_kernel", cuda, 100.0)]
    rows = operator_rows(events, on_gpu=True)  # the kernels' rows repeat their operators' device time
    assert [r["operator"] for r in rows] == ["aten::mm", "aten::relu"]
    assert sum(r["self_ms"] for r in rows) == pytest.approx(0.4)
    assert len(operator_rows(events, on_gpu=False)) == 4  # a CPU profile has no kernel rows to drop


def test_the_shipped_recipe_prints_without_wrapping():
    from labkit.messages import WIDTH

    assert all(len(line) <= WIDTH for line in lab.RECIPE_PATH.read_text().splitlines())  # 09 prints the file


def test_the_language_model_recipe_is_checked_on_its_baseline_and_stacked(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LABKIT_PROFILE", "ci")
    base = labkit.workloads.lm_finetune_config(max_steps=4, train_size=128, batch_size=16, evaluate=False)
    stages = lab.recipe_stages(lab.LM_RECIPE_PATH, base)
    assert [s.key for s in stages] == ["packing", "precision", "lora_rank", "optimizer"]
    assert stages[2].changes == {"lora_rank": 8, "lora_targets": "all-linear", "lr": 0.003}  # lr goes with LoRA
    with pytest.raises(ConfigError, match="packing='pack' is not allowed"):
        lab.recipe_stages(lab.LM_RECIPE_PATH)  # checked alone it is a vision config, where packing means nothing
    rec = lab.lm_stages(base)
    frame = rec.frame
    assert rec.test_size > 0
    scored = LmRecipe(frame.assign(accuracy=[0.5, 0.5, 0.5, 0.5, 0.45]), test_size=1000)  # evaluate=False above
    assert scored.finding().startswith(f"On {base.model}, the whole recipe") and "(lower)" in scored.finding()
    assert frame.added.tolist()[0] == "baseline" and frame.error.isna().all() and len(frame) == 5
    assert frame.num_trainable_params.iloc[-1] < 0.2 * frame.num_trainable_params.iloc[0]
    assert frame.peak_memory_bytes.iloc[-1] < frame.peak_memory_bytes.iloc[0]
