import json

import pandas as pd
import pytest

import labkit
from labkit import messages, results
from labkit.errors import ConfigError, DatasetUnavailableError, NonFiniteLossError
from labkit.result import RunResult


@pytest.fixture
def fake_fit(monkeypatch, tmp_path):
    """Replace training with a fast fake that records the configs it ran."""
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    ran = []

    def fit(cfg, progress=True, on_step=None):
        ran.append(cfg)
        if cfg.batch_size == 999:
            raise NonFiniteLossError(3, float("nan"), cfg.precision)
        return RunResult(config=cfg.to_dict(), env=dict(labkit.env_report()), step_time_s=0.01 * cfg.batch_size,
                         throughput=100.0, accuracy=0.5, memory={"activations": cfg.batch_size * 10},
                         timed_steps=4)

    monkeypatch.setattr("labkit.results.fit", fit)
    return ran


def test_sweep_product_rows_and_provenance(fake_fit, tiny_cfg):
    df = labkit.sweep(tiny_cfg, batch_size=[16, 32], precision=["fp32", "bf16"])
    assert isinstance(df, pd.DataFrame) and len(df) == 4 and len(fake_fit) == 4
    assert sorted(zip(df.batch_size, df.precision, strict=True)) == [
        (16, "bf16"), (16, "fp32"), (32, "bf16"), (32, "fp32")]
    for column in ("device", "torch", "labkit", "profile", "seed", "repeats", "source", "error"):
        assert column in df
    assert set(df.source) == {"live"} and df.profile.eq("ci").all() and df.error.isna().all()
    assert list(df.mem_activations_bytes) == [bs * 10 for bs in df.batch_size]


def test_sweep_reuses_cache_and_refresh_reruns(fake_fit, tiny_cfg):
    labkit.sweep(tiny_cfg, batch_size=[16, 32])
    labkit.sweep(tiny_cfg, batch_size=[16, 32])
    assert len(fake_fit) == 2
    df = labkit.sweep(tiny_cfg, batch_size=[16, 32], refresh=True)
    assert len(fake_fit) == 4 and list(df.step_time_s) == pytest.approx([0.16, 0.32])
    assert len(list(results.results_dir().glob("*.json"))) == 2


def test_failed_run_becomes_a_row(fake_fit, tiny_cfg):
    df = labkit.sweep(tiny_cfg.replace(train_size=1000), batch_size=[16, 999])
    assert len(df) == 2
    assert df.error.iloc[0] is None or pd.isna(df.error.iloc[0])
    assert "NonFiniteLossError" in df.error.iloc[1] and "step 3" in df.error.iloc[1]
    assert len(list(results.results_dir().glob("*.json"))) == 1  # failures are not cached


def test_sweep_rejects_bad_setups_before_running(fake_fit, tiny_cfg, monkeypatch):
    with pytest.raises(ConfigError, match=r"sweep axis batch_size=\[\] is not allowed: a non-empty list"):
        labkit.sweep(tiny_cfg, batch_size=[])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device='cuda' is not allowed"):
        labkit.sweep(tiny_cfg, device=["cpu", "cuda"])
    assert fake_fit == []


def test_any_run_error_becomes_a_row_but_missing_data_stops(monkeypatch, tmp_path, tiny_cfg):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))

    def fit(cfg, progress=True, on_step=None):
        if cfg.dataset == "cifar10":
            raise DatasetUnavailableError("no CIFAR-10 here")
        raise ValueError("Expected more than 1 value per channel")

    monkeypatch.setattr("labkit.results.fit", fit)
    df = labkit.sweep(tiny_cfg, batch_size=[16])
    assert df.error.iloc[0] == "ValueError: Expected more than 1 value per channel"
    with pytest.raises(DatasetUnavailableError, match="no CIFAR-10"):
        labkit.sweep(tiny_cfg, dataset=["cifar10", "shapes10"])


def test_cached_warnings_are_shown_once_as_a_note(fake_fit, tiny_cfg, monkeypatch, capsys):
    real_fit = labkit.train.fit

    def warned_fit(cfg, progress=True, on_step=None):
        res = real_fit(cfg)
        res.warnings = ["NO PRETRAINED WEIGHTS for small_cnn"]
        return res

    monkeypatch.setattr("labkit.results.fit", warned_fit)
    results.cached_fit(tiny_cfg)
    capsys.readouterr()
    messages.forget_notes()  # as in a new session: the cached run tells what the live one warned about
    results.cached_fit(tiny_cfg)
    assert capsys.readouterr().out == "labkit note: NO PRETRAINED WEIGHTS for small_cnn\n"
    results.cached_fit(tiny_cfg)  # once per session, not once per cached run
    assert capsys.readouterr().out == ""


def test_sweep_bad_axes(tiny_cfg):
    with pytest.raises(ConfigError, match=r"sweep axis key='batchsize' is not allowed.*Did you mean 'batch_size'"):
        labkit.sweep(tiny_cfg, batchsize=[1, 2])
    with pytest.raises(ConfigError, match=r"sweep axis batch_size=32 is not allowed: a non-empty list of values"):
        labkit.sweep(tiny_cfg, batch_size=32)
    with pytest.raises(ConfigError, match="batch_size=0"):
        labkit.sweep(tiny_cfg, batch_size=[32, 0])


def test_cache_key_depends_on_config_and_hardware(tiny_cfg):
    env = dict(labkit.env_report())
    key = results.cache_key(tiny_cfg, env)
    assert key == results.cache_key(tiny_cfg, dict(env))
    assert key != results.cache_key(tiny_cfg.replace(seed=1), env)
    assert key != results.cache_key(tiny_cfg, {**env, "gpu": "Tesla T4", "device": "cuda"})
    assert key != results.cache_key(tiny_cfg, {**env, "profile": "quick"})


def test_cache_key_depends_on_whether_weights_may_be_downloaded(tiny_cfg, monkeypatch):
    env = dict(labkit.env_report())
    offline = results.cache_key(tiny_cfg, env)
    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    assert results.cache_key(tiny_cfg, env) != offline


def test_interrupted_write_keeps_the_previous_result(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    results.write_json_atomic(path, {"ok": 1})

    def explode(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(results.json, "dump", explode)
    with pytest.raises(KeyboardInterrupt):
        results.write_json_atomic(path, {"ok": 2})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_corrupt_cache_file_is_rerun(fake_fit, tiny_cfg):
    results.cached_fit(tiny_cfg)
    (path,) = results.results_dir().glob("*.json")
    path.write_text(json.dumps({"not": "a result"}))
    results.cached_fit(tiny_cfg)
    assert len(fake_fit) == 2


def test_reference_results_load_in_sweep_shape(tmp_path, monkeypatch, tiny_cfg):
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    run = RunResult(config=tiny_cfg.to_dict(), env={"device": "cuda", "gpu": "Tesla T4"}, step_time_s=0.02)
    results.write_reference([run], tmp_path / "tesla-t4-2026-11-30.json")
    ref = labkit.load_reference()
    assert len(ref) == 1 and ref.source.iloc[0].startswith("reference: Tesla T4 ")
    assert ref.step_time_s.iloc[0] == 0.02 and ref.model.iloc[0] == "small_cnn"
    assert len(labkit.load_reference(model="resnet18")) == 0
    with pytest.raises(ConfigError, match="load_reference filter='gpu_name' is not allowed: a column of these"):
        labkit.load_reference(gpu_name="T4")


def test_reference_rows_load_as_written_and_filter_on_their_own_columns(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    rows = pd.DataFrame({"batch_size": [8, 16], "epoch_time_s": [0.5, 0.3], "lr_setting": ["same lr", "scaled"]})
    results.write_reference([], tmp_path / "02_batch_size-sweep-t4.json", rows=rows,
                            env={"gpu": "Tesla T4", "profile": "full"})
    ref = labkit.load_reference("02_batch_size-sweep*", lr_setting="scaled")
    assert ref.to_dict(orient="records") == [{"batch_size": 16, "epoch_time_s": 0.3, "lr_setting": "scaled",
                                              "source": ref.source.iloc[0]}]
    assert ref.source.iloc[0].startswith("reference: Tesla T4")
    assert labkit.load_reference("nothing-here*", lr_setting="scaled").empty  # nothing shipped: no error
    assert json.loads((tmp_path / "02_batch_size-sweep-t4.json").read_text())["profile"] == "full"


def test_no_reference_gives_empty_frame_with_columns(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    ref = labkit.load_reference()
    assert ref.empty and "step_time_s" in ref and "source" in ref


def test_run_configs_keeps_order_and_turns_failures_into_results(fake_fit, tiny_cfg):
    configs = [tiny_cfg.replace(batch_size=b, train_size=1000) for b in (32, 999, 16)]
    runs = results.run_configs(configs, progress=False)
    assert [r.config["batch_size"] for r in runs] == [32, 999, 16]
    assert [r.ok for r in runs] == [True, False, True] and "NonFiniteLossError" in runs[1].error
    assert results.run_configs(configs[:1]) and len(fake_fit) == 3  # the first run came from the cache


def test_cached_record_computes_once(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return {"latency_s": 0.5 * len(calls)}

    assert results.cached_record("abc-inference", compute) == {"latency_s": 0.5}
    assert results.cached_record("abc-inference", compute) == {"latency_s": 0.5} and len(calls) == 1
    assert results.cached_record("abc-inference", compute, refresh=True) == {"latency_s": 1.0}
    (results.results_dir() / "abc-inference.json").write_text("{not json")
    assert results.cached_record("abc-inference", compute) == {"latency_s": 1.5}


def test_cached_frame_measures_once_per_configs_and_params(tmp_path, monkeypatch, tiny_cfg):
    import math

    monkeypatch.setattr(results, "results_dir", lambda: tmp_path)
    calls = []

    def measure():
        calls.append(1)
        return pd.DataFrame({"method": ["fp32", "int8"], "latency_s": [0.0123456789012345, math.nan],
                             "reason": [None, "no kernel"], "ran": [True, False]})

    first = results.cached_frame("demo", [tiny_cfg], measure, methods=["fp32", "int8"])
    again = results.cached_frame("demo", [tiny_cfg], measure, methods=["fp32", "int8"])
    assert len(calls) == 1
    assert again.latency_s.iloc[0] == first.latency_s.iloc[0] == pytest.approx(0.0123456789012345, rel=1e-13)
    assert math.isnan(again.latency_s.iloc[1]) and again.reason.isna().tolist() == [True, False]
    assert again.ran.tolist() == [True, False] and list(again.columns) == list(first.columns)
    results.cached_frame("demo", [tiny_cfg], measure, methods=["fp32"])  # other params: measured again
    results.cached_frame("demo", [tiny_cfg.replace(seed=1)], measure, methods=["fp32", "int8"])  # another config
    results.cached_frame("demo", [tiny_cfg], measure, refresh=True, methods=["fp32", "int8"])
    assert len(calls) == 4


def test_cached_model_after_cached_fit_keeps_the_first_measurement(tiny_cfg, tmp_path, monkeypatch):
    from labkit import results

    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path))
    first = results.cached_fit(tiny_cfg, progress=False)
    model, again = results.cached_model(tiny_cfg, progress=False)
    assert again.step_time_s == first.step_time_s and again.step_times_s == first.step_times_s
    assert again.model is model and results.cached_fit(tiny_cfg, progress=False).step_time_s == first.step_time_s


def test_every_technique_notebook_shows_at_least_two_published_rows():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "notebooks" / "src"
    for number in range(1, 11):
        source = next(root.glob(f"{number:02d}_*.py")).read_text()
        calls = re.findall(r"results\.published\(([^)]*)\)", source)
        patterns = [p for call in calls for p in re.findall(r'"([^"]+)"', call)]
        patterns += re.findall(r'load_reference\("([^"]*published[^"]*)"\)', source)  # 01 charts its own
        frame = results.published(*patterns) if patterns else None
        assert frame is not None and len(frame) >= 2, f"notebook {number:02d} shows {calls}"
        assert frame.source.str.contains("https://").all() and frame.setup.str.len().le(70).all()


def test_published_rows_come_from_published_files_only(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"pattern='nothing\*' is not allowed: a pattern that matches a published"):
        results.published("nothing*")
    frame = results.published("02_batch_size-warmup*")
    assert list(frame.columns)[0] == "setup" and list(frame.columns)[-1] == "source"
    assert frame.top1_error_pct.iloc[0] == 23.6  # Goyal et al. 2017, table 1: the batch-256 baseline
    # A measured file beside the published ones (the GPU suite's 05_freezing-levels-...) is passed over.
    for path in results.REFERENCE_DIR.glob("05_freezing-*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "05_freezing-levels-nvidia-h200-2026-12-03.json").write_text('{"provenance": "measured", "runs": []}')
    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    assert len(results.published("05_freezing-*")) == len(results.published("05_freezing-*-published*")) >= 2
    with pytest.raises(ConfigError, match=r"pattern='05_freezing-levels\*' is not allowed"):
        results.published("05_freezing-levels*")
