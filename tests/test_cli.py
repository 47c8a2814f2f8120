import json

import pytest
import yaml

from labkit import cli
from labkit.errors import ConfigError


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": "small_cnn", "batch_size": 32, "max_steps": 6, "train_size": 128,
                                    "device": "cpu"}))
    return path


def test_env(capsys):
    assert cli.main(["env"]) == 0
    assert "device" in capsys.readouterr().out


def test_run_prints_table_and_json(config_file, capsys):
    assert cli.main(["run", str(config_file)]) == 0
    out = capsys.readouterr().out
    payload = json.loads(out.strip().splitlines()[-1])
    assert payload["config"]["batch_size"] == 32 and payload["step_time_s"] > 0
    table = out.strip().splitlines()[:-1]
    assert table[0].split() == ["model", "small_cnn"] and any(line.startswith("step time (ms) ") for line in table)
    memory = next(line for line in table if line.startswith("peak memory"))
    assert "(MiB)" in memory or "(KiB)" in memory  # never raw bytes
    assert len(memory.split()[-1].replace(".", "").lstrip("0")) <= 3  # three significant digits


def test_sweep_with_set(config_file, capsys, tmp_path):
    csv = tmp_path / "out.csv"
    assert cli.main(["sweep", str(config_file), "--set", "batch_size=16,32", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    header, *rows = out.strip().splitlines()[:3]
    assert header.split()[:2] == ["batch", "size"] and "step time (ms)" in header and "peak memory (" in header
    assert [row.split()[0] for row in rows] == ["16", "32"]
    assert csv.exists() and len(csv.read_text().splitlines()) == 3


def test_sweep_takes_the_hf_trainer_names(tmp_path, capsys):
    path = tmp_path / "sft.yaml"  # the names a TRL config uses
    path.write_text("model: small_cnn\nper_device_train_batch_size: 8\ngradient_accumulation_steps: 2\n"
                    "max_steps: 6\ntrain_size: 64\ndevice: cpu\nevaluate: false\n")
    assert cli.main(["sweep", str(path), "--set", "learning_rate=1e-3,1e-2"]) == 0
    header, *rows = capsys.readouterr().out.strip().splitlines()[:3]
    assert header.split()[:2] == ["learning", "rate"] and [row.split()[0] for row in rows] == ["0.001", "0.01"]


def test_parse_set():
    assert cli._parse_set(["batch_size=16,32", "precision=fp32"]) == {"batch_size": [16, 32],
                                                                       "precision": ["fp32"]}
    with pytest.raises(ConfigError, match=r"--set='batch_size' is not allowed: FIELD=V1,V2"):
        cli._parse_set(["batch_size"])
    assert cli._parse_set(["lr=1e-3,3e-4"]) == {"lr": [0.001, 0.0003]}
    with pytest.raises(ConfigError, match=r"--set='batch_size=64' is not allowed: each field once"):
        cli._parse_set(["batch_size=32", "batch_size=64"])


def test_bad_config_exits_2_with_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_size: 0\n")
    assert cli.main(["run", str(bad)]) == 2
    assert "batch_size=0 is not allowed" in capsys.readouterr().err
    assert cli.main(["run", str(tmp_path / "missing.yaml")]) == 2


def test_solutions_prints_questions_and_solutions(capsys):
    assert cli.main(["solutions", "00.throughput", "03.checkpoint", "02.max_batch"]) == 0
    out = capsys.readouterr().out
    assert "## 00.throughput\nA training step on a batch of 256 images" in out
    assert "batch_size / (step_time_ms / 1e3)\nwith batch_size=256, step_time_ms=80\n= 3200" in out
    assert "def checkpointed_forward_solution(blocks, x):" in out
    assert "## 02.max_batch (with example numbers: the notebook uses yours)" in out
    assert cli.main(["solutions", "nope"]) == 2
    assert "exercise='nope' is not allowed" in capsys.readouterr().err
