"""Device placement, caught on the CPU: the engine's placement paths run with a second device type standing in for
the GPU (``meta``: shapes, no data), as on a described T4. A tensor left on the CPU where the run's device was
meant (a batch made for one device, a model on another) fails here as it would on CUDA."""

import sys

import pytest
import torch

import labkit
from labkit import env, inference, train
from labkit.capacity.steps import _StepProbe
from labkit.labs.recipe.profiler import profile_step


@pytest.fixture
def meta_gpu(monkeypatch):
    """Decide as on a T4, and let every labkit module's ``resolve_device`` place a GPU run on ``meta``."""
    real = env.resolve_device

    def resolve(device="auto"):
        return torch.device("meta") if real(device).type == "cuda" else real(device)

    for name, module in list(sys.modules.items()):
        if name.startswith("labkit") and getattr(module, "resolve_device", None) is real:
            monkeypatch.setattr(module, "resolve_device", resolve)
    with labkit.machine.described("t4"):
        yield


@pytest.fixture
def gpu_cfg(tiny_cfg):
    return tiny_cfg.replace(device="auto", precision="fp32", pretrained=False, evaluate=False)


def test_the_training_step_puts_model_and_batch_on_the_run_device(meta_gpu, gpu_cfg):
    trainer = train.Trainer(gpu_cfg)
    assert trainer.device.type == "meta" and {p.device.type for p in trainer.model.parameters()} == {"meta"}
    loss = trainer.step(*next(trainer.batches(1)))
    assert loss.device.type == "meta"


def test_an_example_batch_is_on_the_run_device(meta_gpu, gpu_cfg):
    assert inference.example_batch(gpu_cfg, batch_size=4).device.type == "meta"


def test_the_batch_search_probe_places_its_inputs_with_its_model(meta_gpu, gpu_cfg):
    assert _StepProbe(gpu_cfg).activation_elements_per_sample() > 0


def test_the_profiled_step_runs_on_the_run_device(meta_gpu, gpu_cfg):
    profiled = profile_step(gpu_cfg, warmup_steps=1)
    assert profiled.device == "meta"


def test_a_model_left_on_the_cpu_is_caught(meta_gpu, gpu_cfg):
    """What 09's profiler cell did: the model built on the CPU, the batch made for the run's device."""
    model = labkit.models.build(gpu_cfg.model, 10, pretrained=False)[0]
    with pytest.raises(RuntimeError, match="meta"):
        model(inference.example_batch(gpu_cfg, batch_size=2))
