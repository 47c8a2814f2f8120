"""labkit bench: the notebooks' parts and the GPU suite write labelled files that load back, on the CPU at `ci`."""

import dataclasses
import fnmatch
import inspect
import json
import os
import re
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

import labkit
from labkit import cli, downloads, results
from labkit.bench import GPU_SUITE, SuitePart, Workload, run_bench, run_suite, suite, suite_vision_workload
from labkit.bench import parts as bench_parts
from labkit.bench import suite_workloads as bench_workloads
from labkit.bench.common import Part
from labkit.env import PROFILES, SHRINK_ENV
from labkit.errors import ConfigError
from labkit.kinds import language as train_lm
from labkit.labs import lora, quantization
from labkit.labs.lora.qlora import BASE16, NF4, QLoRAComparison
from labkit.labs.quantization.methods import MethodComparison


@pytest.fixture
def bench_cfg(monkeypatch):
    """A run of a few steps: shared by both tests that run real parts, so the second reads the first's runs.

    The batch search's pretend GPU shrinks from 64 to 16 MiB: a quarter of the samples in its largest probes. The
    language-model parts take 2 rows of at most 32 tokens and 4 steps (1 warm-up, 2 profiling, 1 timed): each run's
    cost is then its memory-tracking step's.
    """
    monkeypatch.setattr(bench_parts, "CPU_BUDGET_BYTES", 16 * 2**20)
    monkeypatch.setattr(bench_parts, "ATTENTION_LONGEST", 32)
    monkeypatch.setattr(bench_parts, "LADDER_SHAPE", {"batch_size": 2, "seq_len": 16})
    lm_speed_config = bench_workloads.lm_speed_config
    monkeypatch.setattr(bench_workloads, "lm_speed_config", lambda **fields: lm_speed_config(
        **{"batch_size": 2, "seq_len": 16, "train_size": 8, "max_steps": 4, **fields}))
    return labkit.RunConfig(model="small_cnn", dataset="shapes10", batch_size=8, max_steps=4, train_size=64,
                            device="cpu", evaluate=False)


def _stand_in(real, result):
    """A lab function's stand-in that checks each call against the real signature and returns ``result``."""
    calls = []

    def fake(*args, **kwargs):
        inspect.signature(real).bind(*args, **kwargs)
        calls.append((args, kwargs))
        return result

    fake.calls = calls
    return fake


def test_bench_writes_a_labelled_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "quick")  # the caller's profile must neither leak in nor change
    (path,) = run_bench(out_dir=tmp_path, profile_name="ci", experiments=["00_start_here"])
    payload = json.loads(path.read_text())
    assert path.name.startswith("00_start_here-baseline-cpu-") and payload["profile"] == "ci"
    assert labkit.profile().name == "quick"
    assert payload["versions"]["torch"] and payload["runs"][0]["config"]["model"] == "small_cnn"
    assert payload["extras"]["timing_pitfalls"]["warm_median_s"] > 0
    assert payload["extras"]["env"]["torch"] and "cuda" in payload["extras"]["env"]


def test_bench_parts_for_notebooks_01_to_03_load_back(tmp_path, monkeypatch, bench_cfg):
    paths = run_bench(out_dir=tmp_path, profile_name="ci",
                      experiments=["01_mixed_precision", "02_batch_size", "03_memory_savers"], cfg=bench_cfg)
    parts = sorted(p.name.split("-cpu-")[0] for p in paths)
    assert parts == sorted(["01_mixed_precision-compare", "01_mixed_precision-memory", "01_mixed_precision-layouts",
                            "01_mixed_precision-scaler", "02_batch_size-sweep", "02_batch_size-accumulation",
                            "02_batch_size-search", "02_batch_size-prediction", "03_memory_savers-tradeoff",
                            "03_memory_savers-staged", "03_memory_savers-optimizers"])
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    compare = labkit.load_reference("01_mixed_precision-compare*")
    assert len(compare) == 4 and compare.source.str.startswith("reference: CPU").all()
    sweep = labkit.load_reference("02_batch_size-sweep*")
    assert {"epoch_time_s", "inference_time_s", "lr_setting"} <= set(sweep.columns)  # rows kept as they were
    search = json.loads(next(p for p in paths if "-search-" in p.name).read_text())["extras"]
    assert search["best"] > 0 and search["budget_bytes"] == 16 * 2**20 and search["tried"][0]["fits"] in (True, False)
    staged = labkit.load_reference("03_memory_savers-staged*")
    assert list(staged.stage) == ["baseline", "+AMP", "+checkpointing", "+8-bit optimizer", "all together"]
    with pytest.raises(ConfigError, match="experiments=\\['03_nope'\\] is not allowed"):
        run_bench(out_dir=tmp_path, experiments=["03_nope"])


def test_gpu_suite_runs_every_part_on_the_cpu_and_goes_on_after_one_raises(tmp_path, monkeypatch, bench_cfg, capsys):
    """The CI smoke test of ``labkit bench --suite gpu``: each part writes a file that loads back, or says why not.

    06's comparison and 08's QLoRA runs are stand-ins checked against the real signatures: on a CPU they take
    minutes (emulated fp16, NF4); tests/labs/test_quantization.py and test_lora.py run them. The ladder's compile
    rung says it cannot compile here: a cold compile takes tens of seconds on a CPU.
    """
    monkeypatch.setattr(train_lm, "compile_problem", lambda device: "no compiling in this test")
    monkeypatch.setenv("LABKIT_PROFILE", "quick")
    table = pd.DataFrame([{"model": m, "method": "fp32", "ran": True, "gpu_latency_s": None}
                          for m in ("tiny_vit", "small_cnn")])
    methods = _stand_in(quantization.method_comparison, MethodComparison(table))
    monkeypatch.setattr(quantization, "method_comparison", methods)
    qlora = _stand_in(lora.qlora_comparison, QLoRAComparison(pd.DataFrame([
        {"setup": BASE16, "peak_memory_bytes": 1.0e6, "step_time_s": 0.01, "error": None},
        {"setup": NF4, "peak_memory_bytes": None, "step_time_s": None, "error": "NF4 needs bitsandbytes"}])))
    monkeypatch.setattr(lora, "qlora_comparison", qlora)

    def boom(cfg):
        raise RuntimeError("boom")

    broken = tuple(dataclasses.replace(p, run=boom) if p.label == "01_mixed_precision-layouts" else p
                   for p in GPU_SUITE)
    monkeypatch.setattr(suite, "SUITES", {"gpu": broken})
    started = time.perf_counter()
    report = run_suite("gpu", out_dir=tmp_path, profile_name="ci", cfg=bench_cfg)
    assert time.perf_counter() - started < 60
    assert labkit.profile().name == "quick"  # the caller's profile is back
    rows = {r["part"]: r for r in report.rows}
    assert list(rows) == [p.label for p in GPU_SUITE]
    assert rows["01_mixed_precision-layouts"]["status"] == "failed"
    assert rows["01_mixed_precision-layouts"]["reason"] == "RuntimeError: boom"
    assert rows["07_distributed-dp-vs-ddp"]["status"] == "not run"
    assert "needs 2+ CUDA GPUs" in rows["07_distributed-dp-vs-ddp"]["reason"]
    ok = [label for label, r in rows.items() if r["status"] == "ok"]
    assert len(ok) == len(GPU_SUITE) - 2 and qlora.calls[0][1] == {"rank": 8}
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    for label in ok:
        payload = json.loads((tmp_path / rows[label]["file"]).read_text())
        assert rows[label]["file"].startswith(f"{label}-cpu-") and payload["profile"] == "ci"
        assert {"gpu", "capability", "torch", "cuda", "date"} <= set(payload["extras"]["env"])
        assert payload["runs"] or payload["rows"] or payload["extras"].keys() - {"env"}, label
        if payload["runs"] or payload["rows"]:
            assert len(labkit.load_reference(f"{label}*")) > 0, label
    payloads = {label: json.loads((tmp_path / rows[label]["file"]).read_text()) for label in ok}
    assert all(p["extras"]["fallback"] is None and p["extras"]["workload"] for p in payloads.values())
    assert payloads["01_mixed_precision-compare"]["extras"]["workload"] == {
        "cnn": "small_cnn (pretrained) on shapes10 at its own size, batch 8"}
    lm = payloads["01_mixed_precision-lm"]
    assert lm["extras"]["workload"]["lm_speed"].startswith("tiny_llama (random weights) on pydoc_text")
    assert {"fp32", "fp16 + GradScaler"} <= {r["setup"] for r in lm["rows"]} and "fp16 + GradScaler" in (
        lm["extras"]["finding"])
    attention = payloads["10_language_models-attention"]
    assert [(r["config"]["seq_len"], r["config"]["attn_implementation"]) for r in attention["runs"]] == [
        (n, impl) for n in (8, 16, 32) for impl in ("sdpa", "eager")]
    assert {r["impl"] for r in payloads["10_language_models-optimizers"]["rows"]} == {"forloop", "foreach", "fused"}
    ladder = payloads["10_language_models-ladder"]["rows"]
    assert [r["rung"] for r in ladder] == list(labkit.labs.language.RUNGS) and not any(r["error"] for r in ladder)
    assert ladder[5]["compile"] is True and ladder[5]["compile_time_s"] is None  # said it could not compile here
    semi = json.loads((tmp_path / rows["04_pruning-2to4"]["file"]).read_text())["extras"]
    assert semi["speedup"] is None and "CUDA GPU" in semi["reason"]
    (cfgs,), asked = methods.calls[0]
    assert list(cfgs) == ["tiny_vit", "small_cnn"] and set(asked["methods"]) <= set(quantization.TABLE_METHODS)
    assert {"int4_weight_only", "nf4_bnb", "int8_bnb"} <= set(asked["methods"])
    assert "int8_static" not in asked["methods"]  # CPU-only: the notebook's own story
    summary = labkit.load_reference("gpu_suite-summary*")
    assert list(summary.part) == list(rows) and "boom" in json.loads(report.summary_path.read_text())[
        "extras"]["errors"]["01_mixed_precision-layouts"]
    printed = capsys.readouterr().out
    assert "[17/17] 10_language_models-ladder: ok in" in printed and "15 ok, 1 failed, 1 not run" in printed
    assert "STAND-IN" not in printed and all(r["fallback"] is None for r in report.rows)


def _quick_part(name: str, estimate_s: float, run) -> SuitePart:
    return SuitePart("99_test", name, run, ("cnn",), estimate_s, f"a stand-in ({name})")


def test_gpu_suite_skips_over_the_budget_and_stops_a_part_at_its_limit(tmp_path, monkeypatch, tiny_cfg):
    def sleeps(seconds):
        def run(cfg):
            time.sleep(seconds)
            return Part("x", extras={"slept_s": seconds})
        return run

    stand_ins = (_quick_part("fast", 0.01, sleeps(0)), _quick_part("hangs", 0.01, sleeps(30)),
                 _quick_part("too-big", 100, sleeps(0)))
    monkeypatch.setattr(suite, "SUITES", {"gpu": stand_ins})
    labkit.env_report("cpu")  # its first call probes the CPU for seconds, inside the budget's clock
    report = run_suite("gpu", out_dir=tmp_path, profile_name="ci", budget_s=1.5, cfg=tiny_cfg)
    fast, hangs, too_big = report.rows
    assert fast["status"] == "ok" and json.loads(report.paths[0].read_text())["extras"]["slept_s"] == 0
    assert hangs["status"] == "timed out" and 1.0 < hangs["seconds"] < 5 and "time limit" in hangs["reason"]
    assert too_big["status"] == "skipped" and "over the budget" in too_big["reason"] and "estimate is 100 s" in (
        too_big["reason"])
    assert [r["status"] for r in report.rows] == [r["status"] for r in json.loads(
        report.summary_path.read_text())["rows"]]


def test_gpu_suite_writes_its_summary_when_interrupted(tmp_path, monkeypatch, tiny_cfg):
    def interrupted(cfg):
        raise KeyboardInterrupt

    stand_ins = (_quick_part("done", 0.01, lambda cfg: Part("x", extras={"a": 1})),
                 _quick_part("stopped", 0.01, interrupted), _quick_part("after", 0.01, interrupted))
    monkeypatch.setattr(suite, "SUITES", {"gpu": stand_ins})
    with pytest.raises(KeyboardInterrupt):
        run_suite("gpu", out_dir=tmp_path, profile_name="ci", cfg=tiny_cfg)
    (summary,) = tmp_path.glob("gpu_suite-summary-*.json")
    rows = json.loads(summary.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "interrupted", "not run"]
    assert rows[2]["reason"] == "the suite was interrupted before it" and list(tmp_path.glob("99_test-done-*"))

    def terminated(cfg):  # what `timeout` sends: the summary is written, and the exit status says SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(suite, "SUITES", {"gpu": (_quick_part("terminated", 0.01, terminated),)})
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit, match="143"):
        run_suite("gpu", out_dir=tmp_path, profile_name="ci", cfg=tiny_cfg)
    rows = json.loads(summary.read_text())["rows"]
    assert [(r["status"], r["reason"]) for r in rows] == [("interrupted", "stopped by SIGTERM")]
    assert signal.getsignal(signal.SIGTERM) is handler  # the caller's handler is back


def test_gpu_suite_names_bad_input(tmp_path):
    with pytest.raises(ConfigError, match=r"suite='cpu' is not allowed: one of \['gpu'\]"):
        run_suite("cpu", out_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"parts=\['01_nope'\] is not allowed: part names from \['01_mixed_prec"):
        run_suite("gpu", out_dir=tmp_path, names=["01_nope"])
    with pytest.raises(ConfigError, match=r"budget_s=-5 is not allowed: a number of seconds > 0 \(default 450\)"):
        run_suite("gpu", out_dir=tmp_path, budget_s=-5)
    with pytest.raises(ConfigError, match=r"budget_s=True is not allowed"):
        run_suite("gpu", out_dir=tmp_path, budget_s=True)
    assert [p.label for p in suite.select("gpu", ["08_lora", "01_mixed_precision-memory"])] == [
        "01_mixed_precision-memory", "08_lora-qlora"]
    table = dict(re.findall(r"^(\d\d [\w-]+) +(\d+) ", suite.__doc__, re.MULTILINE))
    assert table == {f"{p.notebook[:2]} {p.name}": str(int(p.estimate_s)) for p in GPU_SUITE}  # the docstring's sizing
    total = sum(p.estimate_s for p in GPU_SUITE if p.notebook != "07_distributed")
    assert f"About {total:.0f} s on one T4" in suite.__doc__ and total > suite.DEFAULT_BUDGET_S  # the tail skipped
    assert [p.name for p in GPU_SUITE[-4:]] == ["lm", "attention", "optimizers", "ladder"]  # over a T4's budget: last
    assert list(tmp_path.iterdir()) == []


def test_cli_bench_suite_and_its_budget(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "SUITES", {"gpu": (_quick_part("fast", 0.01, lambda cfg: Part("x", rows=pd.DataFrame(
        [{"a": 1}]))), _quick_part("fails", 0.01, lambda cfg: 1 / 0))})
    monkeypatch.setattr(suite, "suite_workloads", lambda prof, cfg=None: {"cnn": lambda: Workload(labkit.RunConfig())})
    assert cli.main(["bench", "--suite", "gpu", "--profile", "ci", "--out", str(tmp_path), "--budget-s", "60"]) == 1
    out = capsys.readouterr().out
    assert "99_test-fast: ok in" in out and "ZeroDivisionError: division by zero" in out and "budget 60 s" in out
    assert cli.main(["bench", "--budget-s", "10"]) == 2
    assert "--budget-s=10.0 is not allowed: only with --suite (gpu)" in capsys.readouterr().err
    assert cli.main(["bench", "--suite", "gpu", "--budget-s", "-1", "--out", str(tmp_path)]) == 2
    assert "budget_s=-1.0 is not allowed: a number of seconds > 0" in capsys.readouterr().err


def test_a_notebook_still_shows_its_published_rows_beside_suite_files(tmp_path, monkeypatch):
    """05, 07 and 09 read ``05_freezing-*``, ``07_distributed-*`` and ``09_recipe-*`` as published rows (10 reads
    none of its suite parts' names): a suite file that those patterns also match is passed over, not an error."""
    sources = Path(__file__).parents[1] / "notebooks" / "src"
    patterns = [p for path in sorted(sources.glob("[01][0-9]_*.py"))
                for call in re.findall(r"results\.published\(([^)]*)\)", path.read_text())
                for p in re.findall(r'"([^"]+)"', call)]
    for path in results.REFERENCE_DIR.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    for part in GPU_SUITE:
        (tmp_path / f"{part.label}-nvidia-h200-2026-01-01.json").write_text('{"provenance": "measured"}')
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    taken = sorted(p.label for p in GPU_SUITE if any(fnmatch.fnmatch(f"{p.label}-nvidia-h200-2026-01-01", pattern)
                                                      for pattern in patterns))
    assert taken == ["05_freezing-levels", "07_distributed-dp-vs-ddp", "09_recipe-profiler"]
    assert all(len(results.published(pattern)) for pattern in patterns)


def test_the_suite_labels_its_offline_stand_in_for_cifar10_in_every_file(tmp_path, monkeypatch, capsys):
    """`full` offline without CIFAR-10: ResNet-18 from random weights on shapes10 at full's size and batch (not
    small_cnn at 32x32), said in each part's file and in the summary; with CIFAR-10 on disk, full's own workload."""
    monkeypatch.delenv(SHRINK_ENV, raising=False)  # make test's full-shapes run: `full` must be the real profile
    full = PROFILES["full"]
    monkeypatch.setattr(downloads, "on_disk", lambda name, root=None: name != "cifar10")
    stand_in = suite_vision_workload(full)
    assert (stand_in.cfg.model, stand_in.cfg.dataset, stand_in.cfg.image_size, stand_in.cfg.batch_size,
            stand_in.cfg.pretrained) == ("resnet18", "shapes10", 128, 128, False)
    assert stand_in.fallback.startswith("resnet18 (random weights) on shapes10 at 128x128, batch 128: offline stand-in "
                                        "for cifar10 and ImageNet weights (cifar10 is not on disk and $LABKIT_OFFLINE")
    assert stand_in.fallback.endswith("speed and memory as full's, accuracy not")

    seen = []
    stand_ins = (SuitePart("99_test", "vision", lambda cfg: seen.append(cfg) or Part("x", extras={"a": 1}), ("cnn",),
                           0.01, "a stand-in"),)
    monkeypatch.setattr(suite, "SUITES", {"gpu": stand_ins})
    report = run_suite("gpu", out_dir=tmp_path, profile_name="full")
    assert seen[0].model == "resnet18" and seen[0].max_steps == suite.SUITE_STEPS
    extras = json.loads(report.paths[0].read_text())["extras"]
    assert extras["fallback"] == {"cnn": stand_in.fallback} and extras["workload"]["cnn"].startswith("resnet18 (rand")
    summary = json.loads(report.summary_path.read_text())
    assert summary["rows"][0]["fallback"] == stand_in.fallback == summary["extras"]["workloads"]["cnn"]["fallback"]
    assert f"STAND-IN: {stand_in.fallback}" in capsys.readouterr().out

    monkeypatch.setattr(downloads, "on_disk", lambda name, root=None: True)
    real = suite_vision_workload(full)
    assert (real.cfg.model, real.cfg.dataset, real.cfg.image_size, real.cfg.pretrained, real.fallback) == (
        "resnet18", "cifar10", 128, True, None)
