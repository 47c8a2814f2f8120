"""Each choice a run makes, with its allowed values and its check, in one place: `RunConfig` and the technique
that carries the choice out both import it from here, so the two can never disagree.

- precisions (`PRECISIONS`), optimizers (`OPTIMIZERS`, `EIGHT_BIT_OPTIMIZERS`), freezing levels (`FREEZE_LEVELS`);
- LoRA: `LORA_ALL_LINEAR` and `check_lora` (rank, alpha, dropout, targets);
- language models: batching (`PACKINGS`), attention (`ATTN_IMPLEMENTATIONS`), optimizer kernels (`OPTIMIZER_IMPLS`),
  chunked cross-entropy (`check_loss_chunks`), compiling (`COMPILE_PACKINGS`, `check_compile`);
- quantization methods: `QUANTIZE_METHODS` (what each stores, which library, where it runs) and the simulated
  low-bit ones, `SIMULATED_METHODS`; `check_quantize_method`.

Each check raises `ConfigError` naming the field, the value and what is allowed; ``field`` lets the caller use
its own name for it (``lora_rank`` in a config, ``rank`` in `labkit.techniques.lora.add_lora`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ConfigError
from .validate import is_int, is_number

PRECISIONS = ("fp32", "fp16", "bf16", "auto")
EIGHT_BIT_OPTIMIZERS = ("adamw8bit", "paged_adamw8bit")  # bitsandbytes' 8-bit AdamW (paged: CUDA only)
OPTIMIZERS = ("adamw", "sgd", *EIGHT_BIT_OPTIMIZERS)
FREEZE_LEVELS = ("none", "light", "medium", "heavy", "head_only")  # what each freezes: techniques.freezing
LORA_ALL_LINEAR = "all-linear"  # every Linear layer but the output layer (PEFT's name for it)
# Language models: how token rows are batched (`labkit.text.batching`), the attention kernel, the optimizer's kernels.
PACKINGS = ("pad", "pad_max", "pack")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")  # PyTorch's scaled_dot_product_attention, or softmax(Q K^T) V written out
# torch.optim's implementations: a Python loop over the tensors, one multi-tensor kernel per op, or one fused kernel
OPTIMIZER_IMPLS = ("forloop", "foreach", "fused")
COMPILE_PACKINGS = ("pad_max", "pack")  # every batch seq_len wide: one compiled graph, no recompiles


def check_loss_chunks(chunks, seq_len: int) -> None:
    """`ConfigError` (field ``loss_chunks``) unless ``chunks`` is None or a divisor of ``seq_len`` (equal slices)."""
    if chunks is None:
        return
    if not is_int(chunks) or chunks < 1:
        raise ConfigError("loss_chunks", chunks, "None (one cross-entropy over all tokens) or an integer >= 1")
    if seq_len % chunks:
        divisors = [d for d in range(1, seq_len + 1) if seq_len % d == 0]
        raise ConfigError("loss_chunks", chunks, f"None or a divisor of seq_len={seq_len}: {divisors}",
                          "every slice of the sequence is then as long as the others")


def check_compile(compile_: bool, packing: str) -> None:
    """`ConfigError` (field ``compile``) unless ``compile_`` is a bool, and True only with a fixed-width packing."""
    if not isinstance(compile_, bool):
        raise ConfigError("compile", compile_, "True or False")
    if compile_ and packing not in COMPILE_PACKINGS:
        raise ConfigError("compile", compile_, f"False with packing={packing!r}, or a packing of "
                          f"{list(COMPILE_PACKINGS)}", "'pad' pads each batch to its own longest row, and every "
                          "new width compiles the model again")


def check_choice(field: str, value, allowed: Iterable[str], what: str = "one of", note: str = "") -> str:
    """``value`` if it is one of ``allowed``, else `ConfigError` naming ``field`` and listing them (then ``note``)."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(field, value, f"{what} {allowed}" + (f" {note}" if note else ""))
    return value


def check_optimizer(name: str, field: str = "optimizer") -> str:
    return check_choice(field, name, OPTIMIZERS)


def check_lora(rank, alpha, dropout, targets, fields=("rank", "alpha", "dropout", "targets")) -> tuple[str, ...]:
    """Check LoRA's settings; return ``targets`` as a tuple of layer-name suffixes (or ``("all-linear",)``).

    Args:
        rank: the adapters' inner size, a positive integer.
        alpha: the update's scale is ``alpha / rank``; a number > 0.
        dropout: dropout on the LoRA path, in [0, 1).
        targets: a layer-name suffix, a non-empty list of them, or ``"all-linear"``.
        fields: the names the caller gives these four in its errors.
    """
    rank_f, alpha_f, dropout_f, targets_f = fields
    if not is_int(rank) or rank < 1:
        raise ConfigError(rank_f, rank, "a positive integer (1, 2, 4, 8, ...): the adapters' inner size")
    if not is_number(alpha) or not alpha > 0:
        raise ConfigError(alpha_f, alpha, f"a number > 0 (the update is scaled by {alpha_f} / {rank_f})")
    if not is_number(dropout) or not 0 <= dropout < 1:
        raise ConfigError(dropout_f, dropout, "a number in [0, 1) (dropout on the LoRA path only)")
    return lora_targets(targets, targets_f)


def lora_targets(targets, field: str = "targets") -> tuple[str, ...]:
    """``targets`` as a tuple: a suffix, a non-empty list of suffixes, or ``"all-linear"`` alone."""
    if isinstance(targets, str) and targets:
        return (targets,)
    if isinstance(targets, Iterable) and not isinstance(targets, str):
        values = tuple(targets)
        if values and all(isinstance(t, str) and t for t in values):
            if LORA_ALL_LINEAR in values and len(values) > 1:
                raise ConfigError(field, list(values), f"{LORA_ALL_LINEAR!r} alone, or a list of layer-name suffixes")
            return values
    raise ConfigError(field, targets, f"a Linear-layer name suffix (e.g. 'qkv'), a non-empty list of them, or "
                                      f"{LORA_ALL_LINEAR!r}")


@dataclass(frozen=True)
class QuantizeMethod:
    """One way to quantize a model for inference (carried out by `labkit.techniques.quantization.quantize`).

    Attributes:
        name: what ``RunConfig(quantize=...)`` and ``quantize(model, method)`` call it.
        description: what it stores and computes in. api: the library that does it.
        devices: where its kernels run. weight_bits: bits per quantized weight.
        calibration: whether it needs calibration batches. linear_only: whether it touches only Linear layers.
    """

    name: str
    description: str
    api: str
    devices: tuple[str, ...]
    weight_bits: int
    calibration: bool = False
    linear_only: bool = False


QUANTIZE_METHODS: dict[str, QuantizeMethod] = {m.name: m for m in (
    QuantizeMethod("fp32", "unchanged (the reference)", "torch", ("cpu", "cuda"), 32),
    QuantizeMethod("fp16", "weights and activations in float16", "torch", ("cpu", "cuda"), 16),
    QuantizeMethod("bf16", "weights and activations in bfloat16", "torch", ("cpu", "cuda"), 16),
    QuantizeMethod("int8_dynamic", "int8 Linear weights, activations per batch", "torch.ao (deprecated)", ("cpu",),
                   8, linear_only=True),
    QuantizeMethod("int8_dynamic_torchao", "int8 Linear weights, activations per token", "torchao", ("cpu", "cuda"),
                   8, linear_only=True),
    QuantizeMethod("int8_weight_only", "int8 Linear weights, float matmul", "torchao", ("cpu", "cuda"), 8,
                   linear_only=True),
    QuantizeMethod("int8_static", "int8 weights and activations, calibrated", "torch.ao FX (deprecated)", ("cpu",),
                   8, calibration=True),
    # The same recipe by PT2E, FX graph mode's successor: an exported graph of int8 weights with quantize/dequantize
    # around each int8 operation, computed in float until torch.compile lowers it to int8 kernels.
    QuantizeMethod("int8_pt2e", "int8 static by PT2E: export, x86 quantizer, calibrate", "torchao PT2E", ("cpu",),
                   8, calibration=True),
    QuantizeMethod("int4_weight_only", "4-bit Linear weights in groups", "torchao", ("cuda",), 4, linear_only=True),
    # LLM.int8(): int8 weights, and the few input features above a threshold (outliers) multiplied in 16 bits.
    QuantizeMethod("int8_bnb", "LLM.int8(): outlier features in 16 bits", "bitsandbytes", ("cpu", "cuda"), 8,
                   linear_only=True),
    # On a CPU, layers whose outputs are not a multiple of 32 stay float.
    QuantizeMethod("nf4_bnb", "4-bit NormalFloat blocks (the QLoRA base)", "bitsandbytes", ("cpu", "cuda"), 4,
                   linear_only=True),
)}
# Low-bit weights simulated (rounded per tensor, kept in float32): the accuracy of a 4- or 3-bit model where no
# kernel runs it; the file does not shrink. Kept apart from `QUANTIZE_METHODS`, whose rows are real.
SIMULATED_METHODS = {"int4_simulated": 4, "int3_simulated": 3}


def check_quantize_method(method: str, field: str = "method") -> str:
    """``method`` if it is a quantization method (real or simulated), else `ConfigError` listing them."""
    return check_choice(field, method, [*QUANTIZE_METHODS, *SIMULATED_METHODS])
