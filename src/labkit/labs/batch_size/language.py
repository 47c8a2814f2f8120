"""Section 7 of notebook 02: gradient accumulation over a language model's token losses."""

from __future__ import annotations

from ... import results, text
from ...labresult import LabResult
from ...messages import worded
from ...workloads import lm_speed_config
from .accumulation import peak_and_step


class LMAccumulation(LabResult):
    shown = ("grad_accum", "micro_batch_rows", "tokens_per_step", "peak_memory_bytes", "step_time_s", "loss_diff")

    @worded
    def finding(self) -> str:
        base, most = self.frame.iloc[0], self.frame.iloc[-1]
        return (f"{int(base['tokens_per_step']):,} tokens a step ({int(base['batch_size'])} rows, "
                f"{base['pad_fraction']:.0%} of them padding) on {base['model']}: in {int(most['grad_accum'])} "
                f"micro-batches of {int(most['micro_batch_rows'])} rows, {peak_and_step(base, most)}; the step "
                f"losses match one large batch's within {self.frame['loss_diff'].max():.1e}.")


def lm_accumulation(grad_accum=(1, 2, 4), batch_size: int = 8, refresh: bool = False) -> LMAccumulation:
    """The profile's Llama on ``batch_size`` padded rows a step, in each number of micro-batches of ``grad_accum``."""
    base = lm_speed_config(batch_size=batch_size, packing="pad_max")
    runs = results.run_configs([base.replace(grad_accum=k) for k in grad_accum], refresh=refresh, progress=False)
    frame = results.to_frame(runs)
    frame["micro_batch_rows"] = [batch_size // k for k in grad_accum]
    frame["tokens_per_step"] = batch_size * text.resolve_seq_len(base.dataset, base.seq_len)
    frame["loss_diff"] = [max(abs(a - b) / abs(b) for a, b in zip(run.losses, runs[0].losses, strict=True))
                          for run in runs]
    return LMAccumulation(frame)
