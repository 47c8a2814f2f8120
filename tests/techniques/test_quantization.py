"""labkit.techniques.quantization: affine quantization from scratch equals torch's, every method gives a
smaller model that computes nearly what the float one does, and bad input gets a clear error."""

import copy
import sys
import warnings

import pytest
import torch
from torch import nn

from labkit import measure, models
from labkit.errors import ConfigError, UnsupportedError
from labkit.techniques import quantization as Q


def seeded(name: str = "tiny_vit") -> nn.Module:
    torch.manual_seed(0)
    return models.build(name, num_classes=10, pretrained=False)[0].eval()


def inputs(n: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def vit():
    return seeded()


@pytest.mark.parametrize("symmetric", [False, True])
def test_qparams_are_torchs_minmax_observers(symmetric):
    from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

    w = torch.randn(16, 40) * torch.linspace(0.1, 3, 16)[:, None] + 0.3
    qscheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    dtype = torch.qint8 if symmetric else torch.quint8
    observer = MinMaxObserver(dtype=dtype, qscheme=qscheme)
    observer(w)
    scale, zero_point = Q.affine_qparams(w, symmetric=symmetric)
    expected_scale, expected_zero = observer.calculate_qparams()
    assert torch.allclose(scale, expected_scale) and int(zero_point) == int(expected_zero)
    per = PerChannelMinMaxObserver(ch_axis=0, dtype=dtype, qscheme=torch.per_channel_symmetric if symmetric
                                   else torch.per_channel_affine)
    per(w)
    scales, zeros = Q.affine_qparams(w, symmetric=symmetric, dim=0)
    expected_scales, expected_zeros = per.calculate_qparams()
    assert torch.allclose(scales, expected_scales) and torch.equal(zeros, expected_zeros.to(torch.int64))


@pytest.mark.parametrize("symmetric", [False, True])
def test_quantize_affine_gives_the_integers_torch_stores(symmetric):
    w = torch.randn(32, 24, generator=torch.Generator().manual_seed(3))
    dtype = torch.qint8 if symmetric else torch.quint8
    scale, zero_point = Q.affine_qparams(w, symmetric=symmetric)
    mine = Q.quantize_affine(w, scale, zero_point, symmetric=symmetric)
    torchs = torch.quantize_per_tensor(w, float(scale), int(zero_point), dtype).int_repr().to(torch.int64)
    assert torch.equal(mine, torchs)
    scales, zeros = Q.affine_qparams(w, symmetric=symmetric, dim=0)
    mine = Q.quantize_affine(w, scales, zeros, symmetric=symmetric, dim=0)
    torchs = torch.quantize_per_channel(w, scales, zeros, 0, dtype).int_repr().to(torch.int64)
    assert torch.equal(mine, torchs)
    restored = Q.dequantize_affine(mine, scales, zeros, dim=0)
    assert (restored - w).abs().max() <= scales.max() / 2 + 1e-6  # rounding error: at most half a step


def test_per_channel_error_is_smaller_when_channels_differ_in_range():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 0, 64)[:, None]
    errors = {}
    for dim in (None, 0):
        scale, zero = Q.affine_qparams(w, symmetric=True, dim=dim)
        errors[dim] = (Q.dequantize_affine(Q.quantize_affine(w, scale, zero, symmetric=True, dim=dim), scale, zero, dim)
                       - w).abs().mean()
    assert errors[0] < errors[None] / 3


def test_bits_out_of_range_is_refused():
    with pytest.raises(ConfigError, match=r"bits=1 is not allowed: an integer from 2 to 16"):
        Q.affine_qparams(torch.ones(3), bits=1)


@pytest.mark.parametrize("method", [m for m in Q.METHODS if Q.supported(m, "cpu") is None])
def test_every_cpu_method_gives_a_close_smaller_or_equal_model(vit, method, capsys):
    x = inputs()
    calibration = [inputs(16, seed=s) for s in range(3)] if Q.METHODS[method].calibration else None
    quantized = Q.quantize(vit, method, calibration)
    with torch.no_grad():
        ref, out = vit(x), quantized(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    bits = Q.METHODS[method].weight_bits
    tolerance = {32: 1e-6, 16: 0.02, 8: 0.15, 4: 0.5}[bits] * ref.abs().max()
    if Q.inexact_int8_note(method):  # a CPU without VNNI: the int8 product saturates, and labkit says so
        assert "no VNNI" in capsys.readouterr().out
        tolerance = 0.5 * ref.abs().max()  # about 0.2 measured with oneDNN held to AVX2
    assert (out - ref).abs().max() <= tolerance, method
    size = measure.model_size_bytes(quantized) / measure.model_size_bytes(vit)
    assert size <= {32: 1.0, 16: 0.52, 8: 0.36, 4: 0.25}[bits] + 1e-9, (method, size)
    assert measure.model_size_bytes(vit) == measure.model_size_bytes(seeded())  # the original is left alone


def test_int8_dynamic_leaves_convolutions_in_float():
    cnn = seeded("small_cnn")
    quantized = Q.quantize(cnn, "int8_dynamic")
    assert isinstance(quantized.stem[0], nn.Conv2d) and quantized.stem[0].weight.dtype == torch.float32
    assert measure.model_size_bytes(quantized) > 0.95 * measure.model_size_bytes(cnn)
    static = Q.quantize(cnn, "int8_static", [inputs(16, seed=s) for s in range(2)])
    assert measure.model_size_bytes(static) < 0.35 * measure.model_size_bytes(cnn)


def test_keep_float_leaves_those_layers_alone(vit):
    quantized = Q.quantize(vit, "int8_dynamic", keep_float=("head", "block1"))
    assert type(quantized.head[2]) is nn.Linear and type(quantized.block1.attn.qkv) is nn.Linear
    assert type(quantized.block2.attn.qkv) is not nn.Linear
    static = Q.quantize(vit, "int8_static", [inputs(16)], keep_float=("stem", "head", "LayerNorm"))
    assert isinstance(static.get_submodule("head.0"), nn.LayerNorm)
    assert type(static.get_submodule("stem.proj")) is nn.Conv2d


def test_casts_run_in_their_dtype_and_return_float32(vit):
    half = Q.quantize(vit, "bf16")
    assert next(half.parameters()).dtype == torch.bfloat16
    assert half(inputs()).dtype == torch.float32


def test_fp16_and_int8_dynamic_do_not_stack(vit):
    both = Q.quantize(copy.deepcopy(vit).half(), "int8_dynamic")
    with pytest.raises(RuntimeError, match="Half"):
        both(inputs().half())


def test_qat_trains_with_fake_quantization_then_converts(vit):
    x, labels = inputs(16), torch.arange(16) % 10
    prepared = Q.prepare_qat(vit, x[:2])
    assert prepared.labkit_name == "tiny_vit" and prepared.training
    assert any("fake_quant" in n or "activation_post_process" in n for n, _ in prepared.named_modules())
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.01)
    before = nn.functional.cross_entropy(prepared(x), labels)
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.cross_entropy(prepared(x), labels).backward()
        optimizer.step()
    assert nn.functional.cross_entropy(prepared(x), labels) < before
    int8 = Q.convert_qat(prepared)
    assert measure.model_size_bytes(int8) < 0.4 * measure.model_size_bytes(vit)
    with torch.no_grad():
        assert (int8(x) - prepared.eval()(x)).abs().max() < 0.2 * prepared(x).abs().max()
    with pytest.raises(ConfigError, match=r"prepared='TinyViT' is not allowed: a model returned by prepare_qat"):
        Q.convert_qat(vit)


def test_unknown_method_names_the_methods(vit):
    with pytest.raises(ConfigError, match=r"method='int3' is not allowed: one of \['fp32', 'fp16'.*'int8_dynamic'"):
        Q.quantize(vit, "int3")


def test_static_without_calibration_says_what_to_pass(vit):
    with pytest.raises(ConfigError, match=r"calibration=None is not allowed: a few batches of training inputs for "
                                          r"'int8_static'"):
        Q.quantize(vit, "int8_static")
    with pytest.raises(ConfigError, match=r"calibration=.* a non-empty iterable of input tensors"):
        Q.quantize(vit, "int8_static", [])
    with pytest.raises(ConfigError,
                       match=r"calibration='list' is not allowed: None: 'int8_dynamic' uses no calibration"):
        Q.quantize(vit, "int8_dynamic", [inputs()])


def test_a_method_the_cpu_cannot_run_says_why_and_what_can(vit):
    with pytest.raises(UnsupportedError, match=r"method='int4_weight_only' cannot run here: torchao's int4 weight-only "
                                               r"kernels run on CUDA GPUs only.*What runs here: fp32, fp16"):
        Q.quantize(vit, "int4_weight_only")
    assert "int4_weight_only" not in Q.available("cpu") and "int8_dynamic" in Q.available("cpu")


def test_missing_torchao_is_an_install_hint(vit, monkeypatch):
    real = Q.installed_version
    monkeypatch.setattr(Q, "installed_version", lambda package: None if package == "torchao" else real(package))
    # the torchao built for this torch: no extra lists torchao (labkit.project.torchao_requirement)
    with pytest.raises(UnsupportedError, match=r"torchao is not installed; pip install 'torchao==\d[\d.]*' \(the "
                                               r"torchao release built for this torch\)"):
        Q.quantize(vit, "int8_weight_only")


def test_bad_keep_float_names_what_exists(vit):
    with pytest.raises(ConfigError, match=r"keep_float=\['blocks'\] is not allowed: module names of the model"):
        Q.quantize(vit, "int8_dynamic", keep_float=("blocks",))
    with pytest.raises(ConfigError, match=r"keep_float=\['head'\] is not allowed: empty for 'fp16'"):
        Q.quantize(vit, "fp16", keep_float=("head",))


def test_torchao_skipping_every_layer_is_an_error(vit, monkeypatch):
    pytest.importorskip("torchao")
    import torchao.quantization

    monkeypatch.setattr(torchao.quantization, "quantize_", lambda model, config, filter_fn=None: None)
    with pytest.raises(UnsupportedError, match="torchao quantized none of the Linear layers"):
        Q.quantize(vit, "int8_weight_only")


def test_static_quantized_models_run_without_deprecation_noise(vit):
    static = Q.quantize(vit, "int8_static", [inputs(16)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        Q._silence_deprecations()
        static(inputs())
    assert not [w for w in caught if "deprecated" in str(w.message)]


def test_fake_quantized_weights_take_only_two_to_the_bits_values(vit):
    three = Q.fake_quantize_weights(vit, 3, keep_float=("head",))
    qkv = three.block1.attn.qkv.weight
    assert qkv.dtype == torch.float32 and qkv.unique().numel() <= 2**3
    assert torch.equal(three.head[2].weight, vit.head[2].weight)  # kept in float
    per_channel = Q.fake_quantize_weights(vit, 3, per_channel=True)
    assert all(row.unique().numel() <= 2**3 for row in per_channel.block1.attn.qkv.weight)
    assert (per_channel.block1.attn.qkv.weight - vit.block1.attn.qkv.weight).abs().mean() < (
        qkv - vit.block1.attn.qkv.weight).abs().mean()
    assert not torch.equal(vit.block1.attn.qkv.weight, qkv)  # a copy: the original is untouched
    with pytest.raises(ConfigError, match=r"bits=1 is not allowed"):
        Q.fake_quantize_weights(vit, 1)


def test_int4_runs_tinygemm_on_a_bf16_copy_fed_and_read_in_float32(vit, monkeypatch):
    Int4WeightOnlyConfig = pytest.importorskip("torchao.quantization").Int4WeightOnlyConfig

    config = Q.int4_config(Int4WeightOnlyConfig, 64)
    # not "plain" (mslk) where torchao has the switch (0.14+); older ones (0.12, beside torch 2.5) pack for tinygemm
    assert getattr(config, "int4_packing_format", "tile_packed_to_4d") == "tile_packed_to_4d"
    assert config.group_size == 64
    seen = {}

    def fake_torchao(model, method, names):  # what torchao would be handed on an sm80+ GPU
        seen["dtypes"] = {model.get_submodule(n).weight.dtype for n in names}
        return model

    monkeypatch.setattr(Q, "supported", lambda method, device="cpu": None)  # as on an A100
    monkeypatch.setattr(Q, "_torchao_quantize", fake_torchao)
    small = Q.quantize(vit, "int4_weight_only")
    assert seen["dtypes"] == {torch.bfloat16} and isinstance(small, Q.Cast)
    x = torch.randn(2, 3, 32, 32)
    assert small(x).dtype == torch.float32 and next(vit.parameters()).dtype == torch.float32  # the original kept


def test_int4_on_a_gpu_before_ampere_says_why_and_what_instead():
    import labkit

    pytest.importorskip("torchao")
    with labkit.machine.described("t4"):
        why = Q.supported("int4_weight_only", "cuda")
    assert "tinygemm, on bf16 weights) need compute capability 8.0+; this GPU has 7.5" in why and "nf4_bnb" in why


# --- PT2E: torch.export, the x86 quantizer, calibrate, convert ------------------------------------------------


@pytest.fixture(scope="module")
def cnn():
    return seeded("small_cnn")


@pytest.fixture
def pt2e_runs():
    """PT2E needs a torchao whose torch.ao internals this torch has: not torchao 0.12 on torch 2.5 (the floor)."""
    problem = Q.supported("int8_pt2e")
    if problem is not None:
        pytest.skip(problem)


def test_pt2e_runs_with_the_torch_labkit_pins_and_colabs():
    major_minor = tuple(int(x) for x in torch.__version__.split(".")[:2])
    if major_minor >= (2, 9) and Q.installed_version("torchao"):
        assert Q.supported("int8_pt2e") is None


def test_pt2e_that_fails_inside_torchao_is_reported_not_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise AttributeError("module 'torch.ao.quantization.observer' has no attribute 'AffineQuantizedObserverBase'")

    monkeypatch.setattr(Q.pt2e, "static_pt2e", broken)
    Q.pt2e.problem.cache_clear()
    try:
        why = Q.supported("int8_pt2e")
    finally:
        Q.pt2e.problem.cache_clear()
    assert "PT2E flow fails on torch" in why and "AffineQuantizedObserverBase" in why


def test_pt2e_stores_int8_weights_and_only_what_its_graph_reads(cnn, pt2e_runs):
    pytest.importorskip("torchao")
    int8 = Q.quantize(cnn, "int8_pt2e", [inputs(16, seed=s) for s in range(2)])
    state = int8.state_dict()
    int8_weights = [k for k, v in state.items() if v.dtype == torch.int8]
    assert len(int8_weights) == 8 and not any(v.dtype == torch.float32 and v.dim() == 4 for v in state.values())
    assert measure.model_size_bytes(int8) < 0.3 * measure.model_size_bytes(cnn)  # the float weights are gone
    assert Q.int8_layers(int8) == Q.int8_layers(Q.quantize(cnn, "int8_static", [inputs(16, seed=s) for s in range(2)]))
    with torch.no_grad():
        assert (int8(inputs(5)) - cnn(inputs(5))).abs().max() < 0.05 * cnn(inputs(5)).abs().max()  # any batch size


def test_pt2e_int8_model_computes_its_fake_quantized_reference(cnn, pt2e_runs):
    """The converted graph's output is its weights' and activations' int8 values computed in float: the prepared
    graph with its observers' ranges frozen as fake quantization (torchao's own reference, `convert_pt2e` unfolded)."""
    quantize_pt2e, _ = Q.pt2e.import_pt2e()
    calibration = [inputs(16, seed=s) for s in range(2)]
    model = copy.deepcopy(cnn)
    prepared = quantize_pt2e.prepare_pt2e(Q.export(model, calibration[0]), Q.x86_quantizer(model))
    with torch.no_grad():
        for batch in calibration:
            prepared(batch)
        reference = quantize_pt2e.convert_pt2e(prepared, fold_quantize=False)  # weights quantized at every call
        engine = Q.quantize(cnn, "int8_pt2e", calibration)
        assert torch.allclose(engine(inputs()), reference(inputs()), atol=1e-6)
    weight = next(v for v in engine.state_dict().values() if v.dtype == torch.int8)
    scales = next(v for k, v in engine.state_dict().items() if k.startswith("_scale"))
    integers = Q.quantize_affine(cnn.stem[0].weight.detach(), scales, torch.zeros_like(scales, dtype=torch.int64),
                                 symmetric=True, dim=0)
    assert weight.shape == cnn.stem[0].weight.shape and (weight.long() - integers).abs().max() <= 128  # BN folded in


def test_pt2e_keep_float_leaves_those_layers_in_float(cnn, vit, pt2e_runs):
    calibration = [inputs(16)]
    kept = Q.quantize(cnn, "int8_pt2e", calibration, keep_float=("head", "stem"))
    assert "head.2" not in Q.int8_layers(kept) and "stem.0" not in Q.int8_layers(kept)
    assert "block1.0.0" in Q.int8_layers(kept) and len(Q.int8_layers(kept)) == 6
    no_linear = Q.quantize(vit, "int8_pt2e", calibration, keep_float=("Linear",))
    assert Q.int8_layers(no_linear) == ["stem.proj"]  # the patch embedding is a convolution


def test_pt2e_qat_trains_with_fake_quantization_then_converts(vit, pt2e_runs):
    """On the vision transformer: a model with BatchNorm (the CNN) makes torchao export its 128 conv-BN patterns
    first, about 90 s on CI's two cores, for a code path of torchao's, not labkit's (which the CNN tests above
    exercise in `allow_train_eval`)."""
    x, labels = inputs(16), torch.arange(16) % 10
    prepared = Q.prepare_qat_pt2e(vit, x[:4], keep_float=("head",))
    assert prepared.labkit_name == vit.labkit_name
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.05)
    before = nn.functional.cross_entropy(prepared(x), labels)
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.cross_entropy(prepared(x), labels).backward()
        optimizer.step()
    assert nn.functional.cross_entropy(prepared(x), labels) < before
    int8 = Q.convert_qat_pt2e(prepared)
    static = Q.int8_layers(Q.quantize(vit, "int8_pt2e", [x], keep_float=("head",)))
    assert "head" not in Q.int8_layers(int8) and Q.int8_layers(int8) == static != []
    assert measure.model_size_bytes(int8) < 0.35 * measure.model_size_bytes(vit)
    prepared.eval()
    with torch.no_grad():
        assert (int8(x) - prepared(x)).abs().max() < 0.2 * prepared(x).abs().max()
    with pytest.raises(ConfigError, match=r"prepared='TinyViT' is not allowed: a model returned by prepare_qat_pt2e"):
        Q.convert_qat_pt2e(vit)


def test_pt2e_bad_input_names_the_field_and_what_is_allowed(cnn, pt2e_runs):
    with pytest.raises(ConfigError, match=r"calibration=None is not allowed: a few batches of training inputs for "
                                          r"'int8_pt2e'"):
        Q.quantize(cnn, "int8_pt2e")
    with pytest.raises(ConfigError, match=r"keep_float=\['blocks'\] is not allowed: module names of the model"):
        Q.static_pt2e(cnn, [inputs()], keep_float=("blocks",))
    with pytest.raises(ConfigError, match=r"example_inputs=torch.Size\(\[1, 3, 32, 32\]\) is not allowed: a batch of "
                                          r"at least 2 inputs"):
        Q.export(cnn, inputs(1))


def test_pt2e_without_torchao_or_with_one_too_old_says_what_to_install(cnn, monkeypatch):
    real = Q.installed_version
    monkeypatch.setattr(Q, "installed_version", lambda package: None if package == "torchao" else real(package))
    assert "int8_pt2e" not in Q.available("cpu")
    with pytest.raises(UnsupportedError, match=r"method='int8_pt2e' cannot run here: torchao is not installed; "
                                               r"pip install 'torchao=="):
        Q.quantize(cnn, "int8_pt2e", [inputs()])
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "torchao.quantization.pt2e.quantize_pt2e", None)  # as in a torchao without it
    Q.pt2e.problem.cache_clear()  # what this torch and torchao can do is probed once a process
    try:
        with pytest.raises(UnsupportedError, match=r"method='int8_pt2e' cannot run here: torchao \S+ has no PT2E "
                                                   r"flow \(torchao.quantization.pt2e with X86InductorQuantizer.*pip "
                                                   r"install 'torchao==\d[\d.]*' \(the torchao release built for"):
            Q.quantize(cnn, "int8_pt2e", [inputs()])
    finally:
        Q.pt2e.problem.cache_clear()


def test_pt2e_that_quantizes_nothing_says_so(pt2e_runs):
    """torch 2.9's non-strict export left torchao 0.15's quantizer nothing to match: a float copy, silently."""
    nothing = torch.nn.Sequential(torch.nn.ReLU())
    with pytest.raises(UnsupportedError, match=r"method='int8_pt2e' cannot run here: .*annotated no layer"):
        Q.quantize(nothing, "int8_pt2e", [torch.randn(4, 3)])


def test_06s_own_torchao_import_after_labkit_shows_no_warning_box():
    """Jupyter shows anything logged to stderr as a warning box (the browser test saw torch's pytree notice)."""
    import subprocess

    pytest.importorskip("torchao")
    code = ("import labkit\nfrom labkit.techniques import quantization\n"
            "from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and "KernelPreference" not in done.stderr, done.stderr[-500:]


def exact_int_mm(a, b):
    return (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)


def saturating_int_mm(a, b):
    """int8 x int8 as oneDNN computes it without VNNI: ``a`` shifted to uint8 (+128), each pair of products summed
    in 16 bits with saturation (vpmaddubsw), the shift's 128 x column sums of ``b`` taken off in 32 bits: bit for bit
    what torch._int_mm gave with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, torch 2.14.1)."""
    shifted = a.to(torch.int32) + 128
    pairs = (shifted[:, :, None] * b.to(torch.int32)[None]).reshape(a.shape[0], -1, 2, b.shape[1])
    return (pairs.sum(2).clamp(-32768, 32767).sum(1) - 128 * b.to(torch.int32).sum(0)).to(torch.int32)


def no_cpu_int_mm(a, b):
    raise RuntimeError("_int_mm: not implemented for CPU")  # an older torch


@pytest.mark.parametrize("kernel", [exact_int_mm, saturating_int_mm, no_cpu_int_mm])
def test_a_saturating_int8_product_is_found_and_named_for_the_methods_that_use_it(monkeypatch, kernel):
    from labkit.techniques.quantization import int8_matmul

    monkeypatch.setattr(torch, "_int_mm", kernel)
    int8_matmul.cpu_int_mm_error.cache_clear()
    try:
        error = Q.cpu_int_mm_error()
        notes = {method: Q.inexact_int8_note(method) for method in Q.METHODS}
    finally:
        int8_matmul.cpu_int_mm_error.cache_clear()
    if kernel is exact_int_mm:
        assert error == 0.0 and not any(notes.values())
    elif kernel is no_cpu_int_mm:
        assert error is None and not any(notes.values())
    else:
        assert 0.05 < error < 1
        assert {m for m, text in notes.items() if text} == {"int8_dynamic_torchao", "int8_bnb"}
        assert "int8_dynamic_torchao" in notes["int8_dynamic_torchao"] and "no VNNI" in notes["int8_bnb"]
