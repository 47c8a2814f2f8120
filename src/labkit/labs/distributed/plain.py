"""Notebook 07, section 2: what the notebook's plain DDP script needs, and how it is run with torchrun.

The script (written by the notebook with ``%%writefile``) calls `plain_setup` for the config, data and model as
labkit's `fit` builds them, `plain_summary` to average the losses over the ranks with every rank's weight digest,
and on rank 0 `plain_write`; `run_script` starts it with torchrun and reads what rank 0 wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from ... import data, models, results, train
from ...config import RunConfig
from ...errors import ConfigError
from ...techniques import distributed
from . import jobs
from .jobs import VIT


def mechanism_config() -> RunConfig:
    """The small CPU run that the notebook's plain DDP script and labkit's engine both train, on any machine."""
    return RunConfig(model=VIT, dataset="shapes10", batch_size=32, max_steps=8, train_size=512, device="cpu")


def plain_setup(config_path: str, device: torch.device | str = "cpu"):
    """For a plain DDP script: its config, training split, model (built as `fit` builds it) and input function.

    Args:
        config_path: the JSON config `run_script` wrote. device: this rank's device (the model is moved there).

    Returns:
        ``(cfg, split, model, to_input)``; ``to_input`` turns a uint8 batch into model input on ``device``.
    """
    cfg = RunConfig.from_dict(json.loads(Path(config_path).read_text()), source=config_path)
    split = train.run_splits(cfg)["train"]
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, split.num_classes, pretrained=cfg.pretrained)[0].to(device)
    return cfg, split, model, lambda images: data.to_model_input(images, split, device)


def plain_summary(losses: list, model: torch.nn.Module) -> dict:
    """For a plain DDP script, on every rank: the losses averaged over the ranks and every rank's weight digest.

    Args:
        losses: this rank's loss per step. model: the trained (DDP-wrapped) model.
    """
    mean = distributed.all_reduce_mean(torch.stack(losses))
    return {"losses": mean.tolist(), "weights_sha256": distributed.all_gather(
        distributed.weights_sha256(models.unwrap(model)))}


def plain_write(summary: dict, out: str) -> None:
    """For a plain DDP script, on rank 0: write `plain_summary`'s record to ``out/result.json``."""
    results.write_json_atomic(Path(out) / "result.json", summary)


def plain_exit() -> None:
    """Leave the process at once, after ``destroy_process_group``.

    gloo's threads can abort Python's own shutdown after the job is done ("terminate called without an active
    exception", a known torch issue), which torchrun would report as a crashed rank.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_script(script: str | Path, cfg: RunConfig, nproc: int = 2, progress: bool = True) -> dict:
    """Run a plain DDP ``script`` with torchrun as ``script CONFIG.json OUT``; what it wrote to ``OUT/result.json``.

    Args:
        script: the script's path. cfg: the run it trains. nproc: processes. progress: show a bar.
    """
    device, backend = jobs.check_launch(cfg, nproc, None, None, "raise", None, 1.0, 60.0, None)
    if not Path(script).is_file():
        raise ConfigError("script", str(script),
                          f"a Python file that exists (relative to {Path.cwd()}); write it first")
    out = Path(tempfile.mkdtemp(prefix="labkit-script-"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    command = distributed.torchrun_command([str(script), str(out / "config.json"), str(out)], nproc,
                                           python=sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": str(jobs.threads_per_rank(device.type, nproc)), "PYTHONUNBUFFERED": "1"}
    if device.type == "cpu":  # a script that takes the GPUs when it sees them runs as CPU processes here
        env["CUDA_VISIBLE_DEVICES"] = ""
    jobs.run_job(command, env, out, nproc, jobs.START_UP_S + 600.0, progress,
                 f"{Path(script).name} on {nproc} process(es)")
    record = json.loads((out / "result.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return record

