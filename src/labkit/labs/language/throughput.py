"""Section 2 of notebook 10: a training token's FLOPs by formula (6 N + attention's 12 x layers x hidden x L, Kaplan
et al. 2020) checked against torch's FLOP counter on a short run, with its tokens/s, FLOP/s and MFU."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...config import RunConfig
from ...display import number
from ...env import profile
from ...messages import worded
from ...train import PROFILING_STEPS, fit
from .common import Record


def matmul_parameters(model: nn.Module) -> int:
    """N in 6 N: the weights of ``model``'s ``nn.Linear`` layers (biases included), the output layer among them."""
    return sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False))


def flops_per_token(model: nn.Module, seq_len: int) -> dict:
    """A training token's FLOPs: ``dense`` 6 N, ``attention`` 12 x layers x hidden x ``seq_len``, ``total``."""
    config = model.config
    dense = 6 * matmul_parameters(model)
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    return {"matmul_parameters": dense // 6, "dense": dense, "attention": attention, "total": dense + attention}


def lm_config(seq_len: int = 64, batch_size: int = 8, attn_implementation: str = "eager", **fields) -> RunConfig:
    """Random-weight ``tiny_llama`` on pydoc_text, rows padded to ``seq_len``, the profile's timed steps, no
    evaluation (eager attention: torch's counter sees its QK^T and PV products)."""
    prof = profile()
    base = {"model": "tiny_llama", "dataset": "pydoc_text", "packing": "pad_max", "pretrained": False,
            "evaluate": False, "train_size": 8 * batch_size,
            "max_steps": prof.warmup_steps + PROFILING_STEPS + prof.repeats}
    return RunConfig(**{**base, "seq_len": seq_len, "batch_size": batch_size,
                        "attn_implementation": attn_implementation, **fields})


@dataclass
class FlopsCheck(Record):
    """The formula's FLOPs per step beside the counter's, and the run's speed."""

    shown = ("tokens_per_step", "formula_flops_per_step", "counted_flops_per_step", "formula_over_counted",
             "attention_share", "tokens_per_s", "mfu")

    @worded
    def finding(self) -> str:
        check = self.row
        ratio = check["formula_over_counted"]
        verdict = "matches" if abs(ratio - 1) < 0.05 else "misses"
        text = (f"6 N + attention {verdict} the FLOP counter: {number(ratio)}x its "
                f"{number(check['counted_flops_per_step'])} FLOPs per step "
                f"(attention {number(100 * check['attention_share'])} % of them). "
                f"{number(check['tokens_per_s'])} tokens/s, {number(check['achieved_flops'] / 1e9)} GFLOP/s achieved")
        if check["mfu"] is None or check["mfu"] != check["mfu"]:
            return text + "; MFU needs the device's datasheet peak FLOP/s (none known here: pass peak_flops=)."
        return text + f", MFU {number(100 * check['mfu'])} % of {number(check['peak_flops'] / 1e12)} TFLOP/s."


def flops_check(cfg: RunConfig | None = None, peak_flops: float | None = None, progress: bool = False) -> FlopsCheck:
    """Run ``cfg`` (default `lm_config()`, rows of one width) and set the formula's FLOPs per step beside the
    counter's; MFU against ``peak_flops`` (None: the run's datasheet peak, unknown on a CPU)."""
    cfg = cfg or lm_config()
    res = fit(cfg, progress=progress)
    tokens = cfg.batch_size * cfg.seq_len
    formula = flops_per_token(res.model, cfg.seq_len)
    peak = peak_flops if peak_flops is not None else res.peak_flops
    return FlopsCheck.of({
        "tokens_per_step": tokens, "matmul_parameters": formula["matmul_parameters"],
        "formula_flops_per_step": formula["total"] * tokens, "attention_share": formula["attention"] / formula["total"],
        "counted_flops_per_step": res.flops_per_step,
        "formula_over_counted": formula["total"] * tokens / res.flops_per_step, "tokens_per_s": res.tokens_per_s,
        "step_time_s": res.step_time_s, "step_time_p10_s": res.step_time_p10_s, "step_time_p90_s": res.step_time_p90_s,
        "achieved_flops": res.achieved_flops, "peak_flops": peak,
        "mfu": res.achieved_flops / peak if peak and res.achieved_flops else None})
