import io
import time

import pytest
import torch
import torch.nn as nn

from labkit import measure


def test_step_timer_cpu_measures_each_step():
    timer = measure.StepTimer(torch.device("cpu"))
    for delay in (0.01, 0.1):
        timer.start()
        time.sleep(delay)
        timer.stop()
    first, second = timer.times_s()
    # a sleep lasts at least its delay, and on a busy machine (CI runs Colab's tests beside the browser's at a lower
    # priority) up to tens of ms more: each step is timed apart, and the longer one reads longer
    assert first >= 0.009 and second >= 0.099 and first < second


def test_spread_median_and_deciles():
    median, p10, p90 = measure.spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert median == 3.0 and p10 < 2.0 and p90 > 4.0
    assert all(v != v for v in measure.spread([]))  # NaN
    assert measure.spread([0.5]) == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("name, precision, tf32, expected", [
    ("Tesla T4", "fp16", False, 65e12),
    ("Tesla T4", "fp32", True, 8.1e12),          # no TF32 before Ampere
    ("Tesla P100-PCIE-16GB", "fp16", False, 18.7e12),
    ("Tesla V100-SXM2-16GB", "fp16", False, 125e12),
    ("Tesla V100-PCIE-16GB", "fp16", False, 112e12),
    ("NVIDIA H100 PCIe", "bf16", False, 756e12),
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989e12),
    ("NVIDIA A10G", "bf16", False, None),
    ("NVIDIA A100-SXM4-40GB", "bf16", False, 312e12),
    ("NVIDIA A100-SXM4-40GB", "fp32", True, 156e12),
    ("NVIDIA H200", "bf16", False, 989e12),
    ("Tesla T4", "bf16", False, None),          # emulated: no datasheet figure
    ("Some Future GPU", "fp16", False, None),
    (None, "fp32", False, None),
])
def test_peak_flops_table(name, precision, tf32, expected):
    assert measure.peak_flops(name, precision, tf32) == expected


def test_model_size_is_serialised_bytes_and_parameter_counts():
    model = nn.Sequential(nn.Linear(100, 50), nn.Linear(50, 10))
    model[0].weight.requires_grad_(False)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    assert measure.model_size_bytes(model) == len(buffer.getvalue())
    assert measure.count_parameters(model) == (100 * 50 + 50 + 50 * 10 + 10, 50 + 50 * 10 + 10)


def test_count_flops_linear_forward_and_backward():
    layer = nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64)
    flops = measure.count_flops(lambda: layer(x).sum().backward())
    # forward 2*B*in*out; backward only the weight gradient (x needs no grad): another 2*B*in*out
    assert flops == 2 * (2 * 8 * 64 * 32)


def test_track_step_memory_categories():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # create the optimizer state first, as fit's warm-up does
    mem = measure.track_step_memory(step, model, opt)
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert mem.note is None
    assert mem.peak_by_category["parameters"] == param_bytes
    assert mem.peak_by_category["gradients"] == param_bytes
    # AdamW keeps exp_avg and exp_avg_sq (fp32, same shapes) plus a small step counter per tensor
    assert 2 * param_bytes <= mem.peak_by_category["optimizer_state"] <= 2 * param_bytes + 4 * 64
    # activations: at least the hidden layer's output (64 x 512 floats)
    assert mem.peak_by_category["activations"] >= 64 * 512 * 4
    assert mem.total_peak_bytes == sum(mem.at_peak.values())
    assert mem.peak_by_category["other"] > 0  # the optimizer step's temporaries moved here
    assert mem.total_peak_bytes <= sum(mem.peak_by_category.values())


def test_track_step_memory_falls_back_with_a_note(monkeypatch):
    def broken():
        raise RuntimeError("tracker unavailable")

    monkeypatch.setattr(measure.memory, "_memory_tracker_class", broken)
    ran = []
    mem = measure.track_step_memory(lambda: ran.append(1), nn.Linear(2, 2),
                                    torch.optim.SGD(nn.Linear(2, 2).parameters()))
    assert ran == [1] and mem.total_peak_bytes is None and "tracker unavailable" in mem.note


def test_measure_latency_excludes_warmup_and_restores_mode():
    calls = []

    class Slow(nn.Module):
        def forward(self, x):
            calls.append(self.training)
            time.sleep(0.05 if len(calls) == 1 else 0.001)  # only the first call is slow
            return x

    model = Slow().train()
    lat = measure.measure_latency(model, torch.zeros(1), warmup=2, repeats=5)
    assert len(lat.times_s) == 5 and lat.median_s < 0.02
    assert calls == [False] * 7 and model.training


def test_timing_pitfalls_cold_call_is_slowest():
    state = {"n": 0}

    def fn():
        state["n"] += 1
        time.sleep(0.05 if state["n"] == 1 else 0.002)

    tp = measure.timing_pitfalls(fn, torch.device("cpu"), warmup=2, repeats=5)
    assert tp.first_call_s > 0.04 and tp.warm_median_s < 0.02 and tp.cold_vs_warm > 2
    assert state["n"] == 1 + 2 + 5 + 5 and tp.device == "cpu"


def test_library_warm_up_is_a_no_op_on_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("no CUDA call on a CPU"))
    measure.warm_up_libraries(torch.device("cpu"))
    assert not measure.timing._LIBRARIES_READY


def test_inference_peak_counts_the_model_and_the_forwards_largest_moment():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).train()
    x = torch.randn(32, 64)
    params = sum(p.numel() * 4 for p in model.parameters())
    small, large = measure.inference_peak_bytes(model, x), measure.inference_peak_bytes(model, torch.randn(320, 64))
    assert model.training  # the mode is restored
    assert params + 32 * 256 * 4 <= small < params + 3 * 32 * 256 * 4  # the hidden layer's output, at most a copy more
    assert large - small >= 9 * 32 * 256 * 4  # grows with the batch
    import torch.nn.utils.prune as prune

    prune.l1_unstructured(model[0], "weight", amount=0.5)  # a mask buffer, and the weight recomputed per forward
    assert measure.inference_peak_bytes(model, x) >= small + 2 * 64 * 256 * 4


def test_inference_peak_accepts_frozen_parameters():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model[0].requires_grad_(False)
    frozen = measure.inference_peak_bytes(model, torch.randn(8, 16))
    model[0].requires_grad_(True)
    assert frozen == measure.inference_peak_bytes(model, torch.randn(8, 16))


def test_tensor_bytes_counts_each_storage_once_and_what_quantized_weights_carry():
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Linear(64, 64))
    model[2].weight = model[0].weight  # tied: one storage
    expected = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert measure.tensor_bytes(model, "cpu") == expected
    assert measure.tensor_bytes(model, "meta") == 0  # nothing of it on another device
    bnb = pytest.importorskip("bitsandbytes")
    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.randn(64, 64), requires_grad=False, quant_type="nf4")
    layer = layer.to("cpu")  # quantizes
    packed = layer.weight.untyped_storage().nbytes()
    assert packed == 64 * 64 // 2 and measure.tensor_bytes(layer, "cpu") > packed  # + the absmax scales


def test_a_model_handed_in_on_the_device_counts_as_the_runs_own(monkeypatch):
    import labkit
    from labkit import train

    cfg = labkit.RunConfig(model="small_cnn", dataset="shapes10", batch_size=8, max_steps=6, train_size=64,
                           device="cpu")
    model = labkit.models.build("small_cnn", 10, pretrained=False)[0]
    held = 5_000_000  # what earlier runs and a notebook's tensors hold, plus this model: allocated before the run
    monkeypatch.setattr(measure, "allocated_now", lambda device: held + measure.tensor_bytes(model, device))
    assert train.Trainer(cfg, model=model).baseline_bytes == held  # so its weights count in the run's peak


def test_flops_of_the_gpu_attention_kernels_count_grouped_query_attention(monkeypatch):
    # torch 2.9's own SDPA formulas asserted equal query and key/value heads, so counting a GQA model's step on an
    # A100 or L4 (the flash kernel, no mask) raised. Meta tensors run the kernel's shapes on a CPU.
    from torch.utils import flop_counter

    def torch_2_9(query_shape, key_shape, value_shape, *args, **kwargs):
        assert query_shape[1] == key_shape[1], "torch 2.9: heads must match"
        return 0

    op = torch.ops.aten._scaled_dot_product_flash_attention
    monkeypatch.setitem(flop_counter.flop_registry, op, flop_counter.shape_wrapper(torch_2_9))
    q = torch.randn(2, 4, 8, 16, device="meta")  # 4 query heads
    k, v = (torch.randn(2, 2, 8, 16, device="meta") for _ in range(2))  # 2 key/value heads
    with pytest.raises(AssertionError, match="heads must match"), flop_counter.FlopCounterMode(display=False):
        op(q, k, v)  # torch's counter, as on torch 2.9
    forward = 2 * 2 * 4 * 8 * 8 * (16 + 16)  # Q K^T and scores x V for each query head
    assert measure.count_flops(lambda: op(q, k, v)) == forward
    assert measure.counts.sdpa_flops((2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)) == forward  # no GQA: the same
    # the backward pass: the gradients of the scores, V, Q and K, twice the forward's products
    assert measure.counts.sdpa_backward_flops((2, 4, 8, 16), (2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)) == 2 * forward
    q, k, v = (torch.randn(2, 4, 8, 16, device="meta", requires_grad=True) for _ in range(3))
    step = torch.ops.aten._scaled_dot_product_efficient_attention
    assert measure.count_flops(lambda: step(q, k, v, None, True)[0].sum().backward()) == 3 * forward


def test_in_turns_times_each_call_once_a_round():
    log = []
    calls = {"fast": lambda: log.append("fast"), "slow": lambda: (log.append("slow"), time.sleep(0.002))}
    times = measure.in_turns(calls, repeats=4, device=torch.device("cpu"))
    assert log == ["fast", "slow"] * 4
    (fast, *_), (slow, slow_p10, slow_p90) = times["fast"], times["slow"]
    assert fast < slow_p10 <= slow <= slow_p90 and slow >= 0.002
