"""The notebooks' check cells hold on a GPU too: run against frames shaped like a GPU's results."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import labkit
from labkit.labs import lora, memory_savers
from labkit.labs.memory_savers.accounting import rounding_allowance
from labkit.techniques import checkpointing

ROOT = Path(__file__).resolve().parents[2]


def cell_with(notebook: str, marker: str) -> str:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code" and marker in "".join(c["source"])]
    return "".join(cell["source"])


def setups_frame(bf16_error=None):
    mib = 2**20
    rows = {"fp32": 40, "fp32 + TF32": 40, "fp16 + GradScaler": 24, "bf16": 24}
    frame = pd.DataFrame([{"setup": name, "mem_parameters_bytes": mib, "mem_gradients_bytes": mib,
                           "mem_optimizer_state_bytes": 2 * mib, "mem_activations_bytes": act * mib, "error": None}
                          for name, act in rows.items()])
    if bf16_error:
        bf16 = frame.setup == "bf16"
        frame.loc[bf16, "error"] = bf16_error
        frame.loc[bf16, [c for c in frame.columns if c.startswith("mem_")]] = np.nan
    return frame


def test_01s_memory_check_allows_a_refused_bf16_on_a_pre_ampere_gpu():
    check = cell_with("01_mixed_precision.ipynb", "every setup ran, except possibly bf16")
    t4 = {"bf16": False, "device": "cuda"}
    exec(check, {"df": setups_frame("RuntimeError: bf16 is not supported on this GPU"), "ENV": t4})
    exec(check, {"df": setups_frame(), "ENV": t4})
    with pytest.raises(AssertionError):  # a failed bf16 run where bf16 is native is a real failure
        exec(check, {"df": setups_frame("RuntimeError: boom"), "ENV": {"bf16": True, "device": "cuda"}})


def test_03s_accuracy_check_allows_gpu_noise_but_not_a_real_change():
    check = cell_with("03_memory_savers.ipynb", "checkpointing must not change what the model learns")
    setup = {"labkit": labkit, "checkpointing": checkpointing, "P": labkit.profile("full"), "cfg": labkit.RunConfig()}
    blocks = len(checkpointing.checkpoint_blocks("small_cnn"))

    def tradeoff(accuracies):
        return pd.DataFrame({"segments": range(blocks + 1), "error": None, "accuracy": accuracies,
                             "mem_activations_bytes": [10.0] + [5.0] * blocks, "flops_ratio": [1.0] + [1.3] * blocks})

    # On a T4 the runs differ by a few of the 5,000 test images: non-deterministic kernels, not a bug.
    exec(check, {**setup, "tradeoff": tradeoff([0.912, 0.910, 0.915, 0.909, 0.913][:blocks + 1])})
    with pytest.raises(AssertionError):
        exec(check, {**setup, "tradeoff": tradeoff([0.91] + [0.85] * blocks)})


def test_03s_calculator_check_allows_the_cuda_allocators_rounding():
    check = cell_with("03_memory_savers.ipynb", "check.rounding_bytes")
    small = pd.DataFrame({"component": ["weights"], "calculated_bytes": [1_000_000], "measured_bytes": [1_020_000],
                          "difference_bytes": [20_000], "rounding_bytes": [23 * 511]})

    class Lab:
        @staticmethod
        def calculator_check(cfg):
            return small

    exec(check, {"check": small, "lab": Lab, "cfg": labkit.RunConfig()})  # 2 % off, within the rounding
    with pytest.raises(AssertionError):
        exec(check, {"check": small.assign(rounding_bytes=0), "lab": Lab, "cfg": labkit.RunConfig()})


def test_calculator_check_says_how_much_rounding_a_device_allows(tiny_cfg):
    check = memory_savers.calculator_check(tiny_cfg)
    assert list(check.rounding_bytes) == [0, 0, 0]  # the CPU allocates exactly
    assert (check.difference_bytes.abs() <= 0.01 * check.measured_bytes).all()


def test_the_rounding_allowance_counts_tensors_on_cuda():
    # small_cnn: 23 trainable tensors (see conftest's small_cnn_bytes) plus its BatchNorm buffers
    model, _ = labkit.models.build("small_cnn", 10, pretrained=False)
    params, buffers = len(list(model.parameters())), len(list(model.buffers()))
    assert params == 23
    adamw = rounding_allowance(model, "adamw", True, "cuda")
    assert adamw == {"weights": 511 * (23 + buffers), "gradients": 511 * 23, "optimizer_state": 511 * 46}
    assert rounding_allowance(model, "adamw8bit", True, "cuda")["optimizer_state"] == 511 * 92
    assert rounding_allowance(model, "sgd", False, "cuda")["optimizer_state"] == 0
    first = next(model.parameters())
    first.requires_grad_(False)  # a frozen tensor has no gradient and no optimizer state
    frozen = rounding_allowance(model, "adamw", True, "cuda")
    assert frozen["gradients"] == 511 * 22 and frozen["weights"] == adamw["weights"]
    assert rounding_allowance(model, "adamw", True, "cpu") == {
        "weights": 0, "gradients": 0, "optimizer_state": 0}


def test_07s_scaling_check_holds_on_four_gpus():
    check = cell_with("07_distributed.ipynb", "one row per world size, each measured")
    times = [0.40, 0.21, 0.11]  # 1, 2 and 4 GPUs
    scale = pd.DataFrame({"world_size": [1, 2, 4], "step_time_s": times, "identical_weights": True})
    scale["efficiency"] = times[0] / (scale.world_size * scale.step_time_s)
    exec(check, {"scale": scale})
    scale.loc[2, "efficiency"] = times[0] / (2 * times[2])  # a formula that assumed two processes
    with pytest.raises(AssertionError):
        exec(check, {"scale": scale})


def test_07s_equivalence_check_allows_gpu_drift_after_the_first_steps():
    check = cell_with("07_distributed.ipynb", "the same training on 1 and 2 processes")
    from labkit.labs import distributed as lab

    class Eq:
        identical_weights = True
        early_difference = 2e-5  # nondeterministic GPU kernels: tiny differences early on
        one = type("R", (), {"accuracy": 0.90})
        many = type("R", (), {"accuracy": 0.905})

    exec(check, {"eq": Eq, "labkit": labkit, "P": labkit.profile("full"), "lab": lab})
    Eq.early_difference = 0.05
    with pytest.raises(AssertionError):
        exec(check, {"eq": Eq, "labkit": labkit, "P": labkit.profile("full"), "lab": lab})


def test_08s_qlora_check_holds_where_nf4_does_not_run_and_catches_a_wrong_share():
    check = cell_with("08_lora.ipynb", "its 4-bit weights take 4.127 bits each")
    reason = "bitsandbytes is not installed (pip install bitsandbytes)"
    refused = pd.DataFrame({"setup": ["16-bit base", "NF4 base (QLoRA)"], "error": [None, reason],
                            "base_weight_bytes": [1_048_576, np.nan], "bits_per_4bit_weight": [np.nan, np.nan],
                            "num_trainable_params": [99_850, np.nan]})
    from labkit.labs.lora.qlora import QLoRAComparison as result
    lab = lora
    exec(check, {"qlora": result(refused), "lab": lab})
    ran = refused.assign(error=None, base_weight_bytes=[1_048_576, 270_336], bits_per_4bit_weight=[np.nan, 4.127],
                         num_trainable_params=99_850)
    exec(check, {"qlora": result(ran), "lab": lab})
    with pytest.raises(AssertionError):  # 8-bit storage is not NF4
        exec(check, {"qlora": result(ran.assign(bits_per_4bit_weight=[np.nan, 8.125])), "lab": lab})
