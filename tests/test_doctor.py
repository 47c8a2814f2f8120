"""`labkit.doctor`: each deliberately broken config gets the right diagnosis; healthy ones get none."""

import re
import time

import pytest
import torch

import labkit
from labkit import cli, env
from labkit import troubleshoot as doctor
from labkit.configfile import save_config
from labkit.errors import ConfigError

# launch's error for a rank that hangs (the doctor's probe is `launch` with a short timeout): the only test that
# starts that job
HANG_MESSAGE = r"rank 1 stopped taking part after step 2: rank 0 waited for it .* until the process group's timeout"


@pytest.fixture
def cfg():
    return labkit.RunConfig(model="small_cnn", batch_size=32, max_steps=8, train_size=192, device="cpu")


def statuses(diagnosis):
    return {f.symptom: f.status for f in diagnosis.findings}


def test_a_healthy_config_has_no_problem_and_probes_only_what_it_does(cfg):
    diagnosis = labkit.doctor(cfg)
    assert list(statuses(diagnosis)) == list(doctor.SYMPTOMS)
    assert statuses(diagnosis) == {"nan_loss": "ok", "amp_slower": "not probed", "quantization_drop": "not probed",
                                   "pruning_memory": "not probed", "distributed_hang": "not probed"}
    assert not diagnosis.problems and str(diagnosis).startswith("labkit doctor: no problem found")


def test_an_exploding_loss_is_found_and_a_smaller_lr_with_clipping_fixes_it(cfg):
    diagnosis = labkit.doctor(cfg.replace(optimizer="sgd", lr=50.0))
    nan = diagnosis["nan_loss"]
    assert nan.problem and "exploding gradients" in nan.cause and "lr=50" in nan.cause
    assert nan.fix["lr"] < 50 and "the loss went from" in nan.checked
    fixed = labkit.fit(cfg.replace(optimizer="sgd", **nan.fix), progress=False)
    assert fixed.losses[-1] <= doctor.TAME * fixed.losses[0]  # the remedy the doctor names no longer explodes
    assert diagnosis["quantization_drop"].status == "not probed"
    assert "does not train" in diagnosis["quantization_drop"].observed


def test_a_non_finite_loss_is_found(cfg):
    nan = labkit.doctor(cfg.replace(optimizer="sgd", lr=1e12))["nan_loss"]
    assert nan.problem and "became nan" in nan.observed and "exploding gradients" in nan.cause
    assert nan.fix["lr"] <= 1e11 and nan.checked.count("the loss") >= 1


def test_mixed_precision_slower_than_fp32_on_this_cpu(cfg):
    amp = labkit.doctor(cfg.replace(precision="fp16", batch_size=16))["amp_slower"]
    ms = [float(x.split(" ms")[0].split()[-1]) for x in amp.observed.split(", ")[:2]]
    assert (ms[0] / ms[1] > doctor.SLOWER) == amp.problem  # the verdict follows the measured times
    if not env.cpu_fp16_native():  # emulated fp16 is many times slower than fp32 (measured 11x on 2 cores)
        assert amp.problem and "no tensor cores" in amp.cause and "emulated" in amp.cause
        assert amp.fix == {"precision": "auto"}


@pytest.mark.parametrize("capability, batch, cause, fix", [
    (None, 64, "a CPU runs", {"precision": "auto"}),
    ((6, 0), 64, "compute capability 6.0", {"precision": "auto"}),
    ((7, 5), 8, "a tiny batch (8)", {"batch_size": 64}),
    ((8, 0), 256, "channels-first", {"channels_last": True}),
])
def test_why_mixed_precision_was_slower_follows_the_device_and_batch(capability, batch, cause, fix):
    finding = doctor.amp_slower_finding("observed", "fp16", False, capability, batch)
    assert finding.problem and cause in finding.cause and finding.fix == fix


def test_a_quantization_drop_is_found_and_keeping_a_sensitive_layer_in_float_recovers(cfg):
    quant = labkit.doctor(cfg.replace(quantize="int3_simulated"))["quantization_drop"]
    assert quant.problem and "sensitive layers" in quant.cause
    keep = quant.fix["quantize_keep_float"]
    assert set(keep) <= {"stem", "head"} and keep
    fixed = labkit.fit(cfg.replace(quantize="int3_simulated", quantize_keep_float=keep), progress=False)
    broken = labkit.fit(cfg.replace(quantize="int3_simulated"), progress=False)
    assert fixed.inference["accuracy"] > broken.inference["accuracy"]


def test_static_int8_keeps_accuracy(cfg):
    assert labkit.doctor(cfg.replace(quantize="int8_static"))["quantization_drop"].status == "ok"


def test_unstructured_pruning_leaves_the_size_and_structured_pruning_shrinks_it(cfg):
    prune = labkit.doctor(cfg.replace(prune_amount=0.5))["pruning_memory"]
    assert prune.problem and "stored densely" in prune.cause and prune.fix == {"prune_structured": True}
    assert "100% of the unpruned" in prune.observed and "with prune_structured: true the file is" in prune.checked
    assert labkit.doctor(cfg.replace(prune_amount=0.5, prune_structured=True))["pruning_memory"].status == "ok"


def test_pruning_is_compared_with_the_same_quantization(cfg):
    prune = labkit.doctor(cfg.replace(prune_amount=0.5, quantize="int8_dynamic"))["pruning_memory"]
    assert prune.problem  # int8 shrinks the head, pruning shrinks nothing: compared with int8 alone


def test_a_hanging_rank_is_named_within_the_timeout(cfg):
    start = time.perf_counter()
    hang = labkit.doctor(cfg, nproc=2, fail_rank=1, fail_step=2, fail_how="hang", timeout_s=3)["distributed_hang"]
    assert time.perf_counter() - start < 60
    assert hang.problem and "rank 1" in hang.observed and "rank 1 stopped taking part" in hang.cause
    assert re.search(HANG_MESSAGE, hang.observed), hang.observed  # launch's own error, as the lab words it
    assert "timeout" in hang.remedy


def test_a_job_that_cannot_start_names_the_setting(cfg):
    hang = labkit.doctor(cfg, nproc=2, backend="nccl")["distributed_hang"]
    assert hang.problem and "cannot start" in hang.observed and "backend" in hang.remedy


def test_the_cli_prints_the_diagnosis_and_exits_1_on_a_problem(cfg, tmp_path, capsys):
    path = save_config(cfg.replace(prune_amount=0.5), tmp_path / "broken.yaml")
    assert cli.main(["doctor", str(path)]) == 1
    out = capsys.readouterr().out
    assert "[problem] memory not reduced after pruning" in out and "likely cause: zeros are still stored" in out
    assert cli.main(["doctor", str(save_config(cfg, tmp_path / "fine.yaml"))]) == 0


def test_bad_input_is_named(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("lr: 0.1\nprecison: bf16\n")
    assert cli.main(["doctor", str(path)]) == 2
    assert "precison" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="cfg"):
        labkit.doctor({"lr": 0.1})
    with pytest.raises(ConfigError, match="symptom.*nan_loss"):
        labkit.doctor(labkit.RunConfig(max_steps=8, train_size=192))["nan"]


def test_an_fp16_overflow_is_blamed_on_fp16_when_a_wider_precision_trains(cfg, monkeypatch):
    """fp16 overflowing (NaN) while bf16/fp32 train fine: the remedy is the precision, tried before the lr."""
    def losses(run_cfg):
        if run_cfg.precision == "fp16":
            return None, "the loss became nan at step 3"
        return [2.5, 1.9], "the loss went from 2.5 at step 1 to 1.9 at step 2"

    monkeypatch.setattr(doctor, "_losses", losses)
    monkeypatch.setattr(doctor, "resolve_precision", lambda requested, device: type("P", (), {
        "name": requested, "emulated": requested == "bf16"})())
    finding, trained = doctor.probe_nan(cfg.replace(precision="fp16"))
    assert finding.problem and not trained and "fp16 overflow" in finding.cause
    assert finding.fix == {"precision": "fp32"}  # bf16 is emulated here: fp32 is the safer one
    assert finding.checked.startswith("precision=fp32: the loss went from 2.5")


def test_explain_names_a_known_error_from_an_exception_or_its_message():
    try:
        raise ValueError("Attempting to unscale FP16 gradients.")
    except ValueError as exc:
        finding = doctor.explain(exc)
    assert finding.title == 'training fails with "Attempting to unscale FP16 gradients"'
    assert "torch_dtype=torch.float16" in finding.cause and finding.status == "problem"
    assert doctor.explain("something else") is None


def test_explain_points_a_language_models_out_of_memory_at_its_logits_and_attention():
    cfg = labkit.RunConfig(model="tiny_llama_10m", dataset="pydoc_text", seq_len=256, batch_size=16,
                           attn_implementation="eager", pretrained=False)
    finding = doctor.explain(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), cfg)
    assert finding.symptom == "lm_out_of_memory" and finding.problem
    assert "16 rows x 256 tokens a micro-batch" in finding.cause and "logits" in finding.cause
    assert "attn_implementation='sdpa'" in finding.remedy and "checkpointing=True" in finding.remedy
    assert finding.numbers["logits"] > 0 and finding.numbers["total"] > finding.numbers["activations"]
    assert doctor.explain("CUDA out of memory", labkit.RunConfig()) is None  # a vision run: no token numbers
    sdpa = doctor.explain("CUDA out of memory", cfg.replace(attn_implementation="sdpa", checkpointing=True))
    assert "sdpa" not in sdpa.remedy and "checkpointing=True" not in sdpa.remedy and "grad_accum" in sdpa.remedy
