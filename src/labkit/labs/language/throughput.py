"""Section 2 of notebook 10, tokens/s and MFU: the FLOPs of one training token by formula, checked against torch's
FLOP counter on a short run, and the run's tokens/s, achieved FLOP/s and (given a peak) model FLOPs utilisation.

The formula (Kaplan et al. 2020, PaLM's appendix B): a training token costs 6 N FLOPs, N the weights of the
matrix multiplications (every ``nn.Linear``, the output layer included; the embedding lookup and the norms' gains
do no multiply-adds), 2 N forward and 4 N backward, plus 12 x layers x hidden x L for attention's QK^T and PV
products over a row of L tokens (the whole L x L square, as eager and the counter compute it)."""

from __future__ import annotations

from torch import nn

from ...config import RunConfig
from ...display import number
from ...env import profile
from ...messages import worded
from ...train import PROFILING_STEPS, fit


def matmul_parameters(model: nn.Module) -> int:
    """N in 6 N: the weights of ``model``'s ``nn.Linear`` layers (biases included), the output layer among them.

    Example:
        >>> matmul_parameters(labkit.models.build_llama("tiny_llama", vocab_size=16))
        792576
    """
    return sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False))


def flops_per_token(model: nn.Module, seq_len: int) -> dict:
    """A training token's FLOPs by formula: ``dense`` 6 N, ``attention`` 12 x layers x hidden x ``seq_len``, ``total``.

    Args:
        model: a Llama model (`labkit.models.build_llama`). seq_len: the row width the tokens attend over.
    """
    config = model.config
    dense = 6 * matmul_parameters(model)
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    return {"matmul_parameters": dense // 6, "dense": dense, "attention": attention, "total": dense + attention}


def lm_config(seq_len: int = 64, batch_size: int = 8, attn_implementation: str = "eager", **fields) -> RunConfig:
    """The section's run: random-weight ``tiny_llama`` on pydoc_text, every row padded to ``seq_len`` (fixed width),
    ``repeats`` timed steps after the profile's untimed ones, no evaluation.

    Args:
        seq_len, batch_size: the row width and rows. attn_implementation: ``eager`` by default, whose QK^T and PV
        products torch's counter sees (on a CPU it has no formula for SDPA's kernel; labkit adds them by formula).
        fields: any other `RunConfig` field.
    """
    prof = profile()
    base = {"model": "tiny_llama", "dataset": "pydoc_text", "packing": "pad_max", "pretrained": False,
            "evaluate": False, "train_size": 8 * batch_size,
            "max_steps": prof.warmup_steps + PROFILING_STEPS + prof.repeats}
    return RunConfig(**{**base, "seq_len": seq_len, "batch_size": batch_size,
                        "attn_implementation": attn_implementation, **fields})


def flops_check(cfg: RunConfig | None = None, peak_flops: float | None = None, progress: bool = False) -> dict:
    """Run ``cfg`` (default `lm_config()`) and set the formula's FLOPs per step beside the counter's.

    Args:
        cfg: a language-model run with ``packing="pad_max"`` (each step exactly rows x seq_len tokens).
        peak_flops: the device's peak FLOP/s for MFU (None: the run's datasheet peak, unknown on a CPU).
        progress: show the run's progress bar.

    Returns:
        A dict: ``tokens_per_step``, ``formula_flops_per_step`` (and its ``attention_share``),
        ``counted_flops_per_step``, ``formula_over_counted``, ``tokens_per_s``, ``step_time_s`` (with p10, p90),
        ``achieved_flops`` (FLOP/s), ``peak_flops`` and ``mfu`` (None without a peak).

    Example:
        >>> flops_check()["formula_over_counted"]
        1.0
    """
    cfg = cfg or lm_config()
    res = fit(cfg, progress=progress)
    tokens = cfg.batch_size * cfg.seq_len
    formula = flops_per_token(res.model, cfg.seq_len)
    peak = peak_flops if peak_flops is not None else res.peak_flops
    return {"tokens_per_step": tokens, "matmul_parameters": formula["matmul_parameters"],
            "formula_flops_per_step": formula["total"] * tokens,
            "attention_share": formula["attention"] / formula["total"], "counted_flops_per_step": res.flops_per_step,
            "formula_over_counted": formula["total"] * tokens / res.flops_per_step, "tokens_per_s": res.tokens_per_s,
            "step_time_s": res.step_time_s,
            "step_time_p10_s": res.step_time_p10_s, "step_time_p90_s": res.step_time_p90_s,
            "achieved_flops": res.achieved_flops, "peak_flops": peak,
            "mfu": res.achieved_flops / peak if peak and res.achieved_flops else None}


@worded
def flops_finding(check: dict) -> str:
    """Whether 6 N + attention matches the counter's FLOPs, and the run's speed as tokens/s, FLOP/s and MFU."""
    ratio = check["formula_over_counted"]
    verdict = "matches" if abs(ratio - 1) < 0.05 else "misses"
    text = (f"6 N + attention {verdict} the FLOP counter: {number(ratio)}x its "
            f"{number(check['counted_flops_per_step'])} FLOPs per step "
            f"(attention {number(100 * check['attention_share'])} % of them). "
            f"{number(check['tokens_per_s'])} tokens/s, {number(check['achieved_flops'] / 1e9)} GFLOP/s achieved")
    if check["mfu"] is None:
        return text + "; MFU needs the device's datasheet peak FLOP/s (none known here: pass peak_flops=)."
    return text + f", MFU {number(100 * check['mfu'])} % of {number(check['peak_flops'] / 1e12)} TFLOP/s."
