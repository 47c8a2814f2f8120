"""scripts/estimate_full.py and its ledger (scripts/full_ledger.py): what a notebook runs at `full`, recorded while it
runs here with its runs cut short, and the T4 minutes it comes to (the notebooks' headers quote the method)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import labkit
from labkit import env, evaluation, inference, launcher, train
from labkit.labs.distributed import data_parallel

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("full_ledger", ROOT / "scripts" / "full_ledger.py")
full_ledger = importlib.util.module_from_spec(spec)
spec.loader.exec_module(full_ledger)


def test_plan_mode_is_fulls_sizes_and_steps_with_shrunk_models(monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "full")
    monkeypatch.setenv("LABKIT_SHRINK", "plan")
    plan = labkit.profile()
    full = env.PROFILES["full"]
    assert plan is env.FULL_PLAN and plan.shrunk and env.shrink_requested()
    assert (plan.max_steps, plan.train_size, plan.batch_size, plan.image_size) == (
        full.max_steps, full.train_size, full.batch_size, full.image_size)
    assert plan.dataset == "shapes10"  # offline, in CIFAR-10's place


WRAPPED = (evaluation.evaluate, evaluation.evaluate_tokens, evaluation.score_tokens, inference.latencies,
           launcher.launch)


def _install(tmp_path, monkeypatch) -> Path:
    """The ledger installed for one test (every wrapped name restored after it); returns the ledger's path."""
    monkeypatch.setattr(train.Trainer, "run", train.Trainer.run)
    monkeypatch.setattr(train.Trainer, "step", train.Trainer.step)
    for module in [m for n, m in sys.modules.items() if n.startswith("labkit")]:
        for attribute, value in list(vars(module).items()):
            if any(value is f for f in WRAPPED):
                monkeypatch.setattr(module, attribute, value)
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(full_ledger.LEDGER_ENV, str(ledger))
    full_ledger.install()
    return ledger


def test_the_ledger_records_full_steps_and_cuts_the_run_short(tmp_path, monkeypatch):
    wrapped = WRAPPED
    ledger = _install(tmp_path, monkeypatch)
    cfg = labkit.RunConfig(model="small_cnn", batch_size=16, max_steps=40, train_size=128, device="cpu")
    result = labkit.fit(cfg, progress=False)
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    run, scored = events
    assert run["kind"] == "train" and run["steps"] == 40 and run["config"]["batch_size"] == 16
    assert result.steps == train.PROFILING_STEPS + 1  # cut short here: the profiling steps and one timed step
    assert scored == {"kind": "eval", "model": "small_cnn", "rows": labkit.profile().test_size, "width": None,
                          "image_size": None}
    assert train.total_steps(cfg, 8) == 40  # restored after the run
    # imported by name (`from ...launcher import launch`) is wrapped too: 07's labs launch through their own names
    assert data_parallel.launch is launcher.launch and launcher.launch.__wrapped__ is wrapped[-1]


def test_steps_outside_a_run_repeat_per_shape_and_a_new_shape_runs(tmp_path, monkeypatch):
    ran = []
    original = train.Trainer.step
    monkeypatch.setattr(train.Trainer, "step", lambda self, *a, **k: ran.append(len(a[0])) or original(self, *a, **k))
    ledger = _install(tmp_path, monkeypatch)
    trainer = train.Trainer(labkit.RunConfig(model="small_cnn", batch_size=4, train_size=64, device="cpu"))
    for rows in (4,) * 5 + (8,):  # a timing demo's repeated steps, then a batch-size probe at a new size
        images = torch.randint(0, 256, (rows, 3, 32, 32), dtype=torch.uint8)
        trainer.step(images, torch.randint(0, 10, (rows,)))
    assert ran == [4] * full_ledger.STEPS_HERE + [8]  # the probe ran: its memory is measured, not repeated
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [e["rows"] for e in events] == [4] * 5 + [8]  # every step counted, at its own batch


def test_the_estimate_is_the_stated_method(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    run = {"model": "resnet18", "batch_size": 128, "image_size": 128, "precision": "fp32", "seq_len": None}
    events = [{"kind": "train", "config": run, "steps": 300, "width": None},
              {"kind": "train", "config": {**run, "precision": "auto", "lora_rank": None, "freeze": "heavy"},
               "steps": 100, "width": None},
              {"kind": "eval", "model": "resnet18", "rows": 5000, "width": None, "image_size": 128},
              {"kind": "forward", "models": ["resnet18"], "shape": [64, 3, 128, 128], "calls": 10, "cpu": [True]}]
    ledger.write_text("\n".join(json.dumps(e) for e in events))
    seconds = full_ledger.estimate(ledger, cpu_flops_per_s=1e11)
    forward = full_ledger.forward_flops("resnet18", None, 128)
    assert 1.1e9 < forward < 1.3e9  # ResNet-18 at 128x128: a third of its 1.8 GMAC (3.6 GFLOP) at 224x224
    fp32, fp16 = 8.1e12 * full_ledger.T4_SHARE["fp32"], 65e12 * full_ledger.T4_SHARE["fp16"]
    assert seconds["train"] == pytest.approx(forward * 128 * (300 * 3 / fp32 + 100 * 2 / fp16))
    assert seconds["eval"] == pytest.approx(forward * 5000 / fp32)
    assert seconds["forward_cpu"] == pytest.approx(forward * 64 * 10 / 0.5e11)
    assert seconds["total"] == pytest.approx(seconds["train"] + seconds["eval"] + seconds["forward_cpu"]
                                             + 2 * full_ledger.RUN_OVERHEAD_S)


def test_qloras_runs_count_at_the_precision_a_t4_gives_them(tmp_path):
    # QLoRA's precision follows the device (bf16 on this CPU); on a T4 qlora_dtypes picks fp16
    with labkit.machine.described("t4"):
        assert labkit.labs.lora.qlora.qlora_dtypes(torch.device("cuda"))[2] == "fp16"
    qlora = {"model": labkit.labs.lora.QLORA_MODELS["full"][0], "precision": "bf16"}
    assert full_ledger._precision_on_t4(qlora) == "fp16"
    assert full_ledger._precision_on_t4({"model": "smollm2_135m", "precision": "bf16"}) == "fp32"  # emulated


def test_a_hub_model_is_counted_at_its_real_shape(monkeypatch):
    monkeypatch.delenv("LABKIT_SHRINK", raising=False)
    pytest.importorskip("transformers")
    per_token = full_ledger.forward_flops("smollm2_135m", 64, None) / 64
    shape = labkit.models.HUB_MODELS["smollm2_135m"].shape
    linear = shape.num_parameters() - shape.vocab_size * shape.hidden_size * (1 - shape.tie_word_embeddings)
    assert 2 * linear * 0.9 < per_token < 2 * linear * 1.3  # 2N a token, plus attention (torch.device('meta'))
    assert torch.zeros(1).device.type == "cpu"  # the meta device was only a context


def test_a_small_step_costs_its_launches_not_its_flops(tmp_path):
    # small_cnn, one row a step: microseconds of FLOPs, but every aten op is a launch on the host (OP_S)
    ledger = tmp_path / "ledger.jsonl"
    run = {"model": "small_cnn", "batch_size": 1, "image_size": 32, "precision": "fp32", "seq_len": None}
    ledger.write_text(json.dumps({"kind": "train", "config": run, "steps": 1000, "width": None}))
    seconds = full_ledger.estimate(ledger, cpu_flops_per_s=1e11)
    ops = full_ledger.forward_ops("small_cnn", None, 32)
    assert 20 < ops < 200  # convolutions, norms, activations, pooling, the head
    assert seconds["train"] == pytest.approx(1000 * 3 * ops * full_ledger.OP_S)
    assert seconds["train"] > 1000 * full_ledger.forward_flops("small_cnn", None, 32) * 3 / 4e12 * 10
