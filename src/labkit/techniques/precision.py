"""Mixed precision, the mechanism: which dtype a run uses, the autocast context, the GradScaler, and a
region forced to float32.

fp16 needs a GradScaler (small gradients underflow in fp16); bf16 has fp32's range and needs none.
Notebook 01's experiments and findings are in `labkit.labs.mixed_precision`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .. import machine
from ..env import cpu_bf16_native, cpu_fp16_native, has_tensor_cores, native_bf16

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """What a run will use: ``requested`` is the config value, ``name`` what it resolved to.

    ``emulated``: the device has no arithmetic for it (fp16/bf16 on a CPU without the instructions, bf16 before
    Ampere), so it runs by conversion, many times slower.
    """

    requested: str
    name: str
    warning: str | None = None
    emulated: bool = False

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.name)

    @property
    def uses_scaler(self) -> bool:
        return self.name == "fp16"


def resolve_precision(requested: str, device: torch.device, capability: tuple[int, int] | None = None) -> Precision:
    """Resolve ``auto`` and flag bf16 that would be emulated.

    ``auto``: bf16 where it is native (CUDA capability >= 8.0, a CPU with AVX512-BF16 or AMX), fp16 on
    tensor-core GPUs without it (T4, V100), fp32 elsewhere (P100, a CPU that would emulate bf16).

    Example:
        >>> resolve_precision("auto", torch.device("cuda"), (7, 5)).name
        'fp16'
    """
    device = torch.device(device)
    if device.type == "cuda" and capability is None:
        capability = machine.here().capability
    on_gpu = device.type == "cuda"
    if requested == "auto":
        if on_gpu and native_bf16(capability):
            return Precision(requested, "bf16")
        if on_gpu and has_tensor_cores(capability):
            return Precision(requested, "fp16")
        if not on_gpu and cpu_bf16_native() is True:  # 01 measures native bf16 faster than fp32 on such CPUs
            return Precision(requested, "bf16")
        return Precision(requested, "fp32")
    if requested == "bf16" and on_gpu and not native_bf16(capability):
        major, minor = capability
        advice = ("fp16 with a GradScaler is the fast choice here" if has_tensor_cores(capability)
                  else "this GPU has no tensor cores either, so fp32 is usually the fastest here")
        return Precision(requested, "bf16", emulated=True, warning=(
            f"bf16 on a GPU of capability {major}.{minor} is emulated (native bf16 needs 8.0+, Ampere): "
            f"it runs, but slowly; {advice}"))
    if requested == "fp16" and on_gpu and not has_tensor_cores(capability):
        major, minor = capability
        return Precision(requested, "fp16", warning=(
            f"fp16 on a GPU of capability {major}.{minor} (no tensor cores, e.g. a P100) saves memory, but its "
            "speed-up is uncertain: fp16 arithmetic may be faster on paper (a P100 has double-rate fp16), while "
            "autocast's casts and small kernels eat into it; measure against fp32"))
    if device.type == "cpu" and requested in DTYPES:
        warning = _cpu_warning(requested)
        return Precision(requested, requested, warning=warning, emulated=warning is not None)
    return Precision(requested, requested)


def _cpu_warning(name: str) -> str | None:
    """fp16/bf16 on a CPU without the matching instructions runs by conversion: say so, loudly."""
    native = cpu_fp16_native() if name == "fp16" else cpu_bf16_native()
    if native is not False:  # True, or None (cannot tell: not Linux)
        return None
    needs = "AVX512-FP16 or AMX-FP16" if name == "fp16" else "AVX512-BF16 or AMX-BF16"
    return (f"{name} on this CPU is emulated (no {needs} instructions): autocast converts to {name} and "
            "back around float32 arithmetic, so it runs, usually slower than fp32; memory still shrinks")


def autocast(precision: Precision, device: torch.device):
    """``torch.autocast`` for fp16/bf16, a no-op context for fp32."""
    if precision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=precision.autocast_dtype)


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler enabled only for fp16 (a disabled one passes calls straight through)."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=precision.uses_scaler)


def low_precision_for(env: dict) -> str:
    """The low precision worth using on this machine: bf16 where native, else fp16 on tensor-core GPUs, else bf16.

    On a CPU bf16 is what autocast supports best; a P100 gets fp16, which at least halves activations.

    Example:
        >>> low_precision_for(labkit.env_report())
        'bf16'
    """
    if env.get("bf16"):
        return "bf16"
    if env.get("device") == "cuda":
        return "fp16"
    return "fp16" if env.get("fp16_native") else "bf16"


_FP32_FUNCTIONS: dict[str, type] = {}


def _fp32_function(device_type: str) -> type:
    """An autograd Function that runs its callable in float32 even inside an autocast region.

    ``torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)`` casts floating-point inputs
    to float32 and turns autocast off inside ``forward``; ``custom_bwd`` runs ``backward`` under the
    same autocast state as the forward. (The old ``torch.cuda.amp.custom_fwd`` forms are deprecated.)
    """
    if device_type not in _FP32_FUNCTIONS:

        class Fp32(torch.autograd.Function):
            @staticmethod
            @torch.amp.custom_fwd(device_type=device_type, cast_inputs=torch.float32)
            def forward(ctx, fn, *inputs):
                ctx.fn = fn
                ctx.save_for_backward(*inputs)
                with torch.no_grad():
                    return fn(*inputs)

            @staticmethod
            @torch.amp.custom_bwd(device_type=device_type)
            def backward(ctx, grad_output):
                # Recompute the forward with autograd on (a small op is cheaper to recompute than to keep).
                # Which inputs need a gradient comes from autograd: a saved input cast to float32 (from a
                # bf16/fp16 activation) was made inside forward, without grad, and says requires_grad=False.
                needs = ctx.needs_input_grad[1:]
                inputs = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, needs, strict=True)]
                with torch.enable_grad():
                    output = ctx.fn(*inputs)
                wanted = [t for t in inputs if t.requires_grad]
                grads = iter(torch.autograd.grad(output, wanted, grad_output) if wanted else ())
                return (None, *(next(grads) if t.requires_grad else None for t in inputs))

        _FP32_FUNCTIONS[device_type] = Fp32
    return _FP32_FUNCTIONS[device_type]


def run_in_fp32(fn, *inputs: torch.Tensor) -> torch.Tensor:
    """Call ``fn(*inputs)`` in float32 inside an autocast region, with correct gradients.

    For a numerically sensitive piece of a model (a custom normalisation, a log of small numbers)
    that autocast would otherwise run in fp16/bf16. Inputs are cast to float32; the output is float32.

    Example:
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     y = run_in_fp32(lambda t: t.exp().sum(-1).log(), x)   # y.dtype == torch.float32
    """
    return _fp32_function(inputs[0].device.type).apply(fn, *inputs)
