"""scripts/estimate_full.py and its ledger (scripts/full_ledger.py): what a notebook runs at `full`, recorded while it
runs here with its runs cut short, and the T4 minutes it comes to (the notebooks' headers quote the method)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import labkit
from labkit import env, evaluation, inference, train
from labkit.labs.distributed import jobs

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


def test_the_ledger_records_full_steps_and_cuts_the_run_short(tmp_path, monkeypatch):
    for owner, name in ((train.Trainer, "run"), (train.Trainer, "step"), (train, "evaluate"),
                        (train, "evaluate_tokens"), (evaluation, "evaluate"), (inference, "latencies"),
                        (jobs, "launch")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(full_ledger.LEDGER_ENV, str(ledger))
    full_ledger.install()
    cfg = labkit.RunConfig(model="small_cnn", batch_size=16, max_steps=40, train_size=128, device="cpu")
    result = labkit.fit(cfg, progress=False)
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    run, scored = events
    assert run["kind"] == "train" and run["steps"] == 40 and run["config"]["batch_size"] == 16
    assert result.steps == train.PROFILING_STEPS + 1  # cut short here: the profiling steps and one timed step
    assert scored == {"kind": "eval", "model": "small_cnn", "rows": labkit.profile().test_size, "width": None,
                          "image_size": None}
    assert train.total_steps(cfg, 8) == 40  # restored after the run


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


def test_a_hub_model_is_counted_at_its_real_shape(monkeypatch):
    monkeypatch.delenv("LABKIT_SHRINK", raising=False)
    pytest.importorskip("transformers")
    per_token = full_ledger.forward_flops("smollm2_135m", 64, None) / 64
    shape = labkit.models.HUB_MODELS["smollm2_135m"].shape
    linear = shape.num_parameters() - shape.vocab_size * shape.hidden_size * (1 - shape.tie_word_embeddings)
    assert 2 * linear * 0.9 < per_token < 2 * linear * 1.3  # 2N a token, plus attention (torch.device('meta'))
    assert torch.zeros(1).device.type == "cpu"  # the meta device was only a context
