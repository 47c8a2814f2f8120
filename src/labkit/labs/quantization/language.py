"""Notebook 06, section 5: int8 dynamic quantization of a fine-tuned language model's Linear layers, for CPU
inference: file size, latency per token (fp32 timed twice: the noise), exact match and the answers' perplexity."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pandas as pd
import torch

from ... import evaluation, measure, models, results, text, train
from ...config import RunConfig
from ...env import profile
from ...inference import LogitsOnly, latencies, prompt_ids
from ...labresult import LabResult
from ...measure import compare
from ...messages import worded
from ...techniques import quantization
from ...techniques.precision import resolve_precision
from ...techniques.token_loss import forward_inputs, token_loss_sum
from ...units import mib
from ...workloads import lm_finetune_config
from .workload import latency, timing_noise

FP32, ALL_INT8, HEAD_FLOAT, FP32_AGAIN = ("fp32", "int8 dynamic, every Linear", "int8 dynamic, output layer float",
                                          "fp32, timed again")
LM_EVAL_ROWS = 256  # test examples scored: a 135M model on a free CPU scores a few hundred in seconds


@dataclass
class LmQuantization(LabResult):
    """fp32 and int8 dynamic (every Linear, or the output layer kept float): size, latency, quality."""

    shown = ("variant", "model_size_bytes", "latency_per_token_s", "vs_fp32", "exact_match", "perplexity")

    @worded
    def finding(self) -> str:
        rows = self.frame.set_index("variant")
        fp32, again = rows.loc[FP32], rows.loc[FP32_AGAIN]
        noise = timing_noise(fp32.latency_per_token_s, again.latency_per_token_s)
        def vs_fp32(row) -> str:
            return str(compare(latency(row.latency_per_token_s, noise), latency(fp32.latency_per_token_s, noise),
                               words=("faster", "slower")))

        parts = [f"{name}: {mib(row.model_size_bytes, '.3g')} ({row.size_ratio:.2f}x), {vs_fp32(row)} the latency, "
                 f"exact match {row.exact_match:.1%}, perplexity {row.perplexity:.3f}"
                 for name, row in rows.loc[[ALL_INT8, HEAD_FLOAT]].iterrows()]
        head = (" Its output layer is tied to the token embeddings, so int8 there adds a copy: the output layer kept "
                "float makes the smaller file." if bool(rows.get("tied", pd.Series([False])).iloc[0]) else "")
        return (f"On {fp32.model} (fp32 {mib(fp32.model_size_bytes, '.3g')}, exact match {fp32.exact_match:.1%}, "
                f"perplexity {fp32.perplexity:.3f}; timing noise {noise:.0%}): " + "; ".join(parts) + "." + head)


def lm_quantization(cfg: RunConfig | None = None, refresh: bool = False) -> LmQuantization:
    """The fine-tuned language model (default `lm_finetune_config()`, notebook 08's) in fp32 and int8 dynamic,
    measured once, cached; ``tied`` says whether its output layer shares the token embeddings."""
    cfg = cfg or lm_finetune_config()
    return LmQuantization(results.cached_frame("quant-lm", [cfg], lambda: _measure(cfg, refresh), refresh=refresh,
                                               rows=LM_EVAL_ROWS))


def _quality(model: torch.nn.Module, split: text.TokenData) -> tuple[float, float]:
    """Exact match and the answers' perplexity, teacher-forced, in float32 on the CPU."""
    cpu = torch.device("cpu")
    exact = evaluation.evaluate_tokens(model, split, cpu, resolve_precision("fp32", cpu))
    loss = tokens = 0.0
    with torch.no_grad():
        for batch in text.make_token_loader(split, 256, packing="pad", shuffle=False):
            loss += float(token_loss_sum(model(**forward_inputs(batch)).logits, batch.labels))
            tokens += batch.counts().label_tokens
    return exact, math.exp(loss / max(tokens, 1))


def _measure(cfg: RunConfig, refresh: bool) -> pd.DataFrame:
    trained, _ = results.cached_model(cfg, refresh=refresh, progress=False)
    fp32 = copy.deepcopy(trained).cpu().eval()
    head = [name for name, module in fp32.named_modules() if module is fp32.get_output_embeddings()]
    variants = {FP32: fp32, ALL_INT8: quantization.quantize(fp32, "int8_dynamic"),
                HEAD_FLOAT: quantization.quantize(fp32, "int8_dynamic", keep_float=head)}
    test = train.run_splits(cfg, training=False)["test"]
    scored = text.TokenData(test.name, "test", test.input_ids[:LM_EVAL_ROWS], test.labels[:LM_EVAL_ROWS],
                            test.tokenizer, test.seq_len)
    x = prompt_ids(cfg, profile().latency_batch)
    timed = [*variants.values(), copy.deepcopy(fp32)]  # float32 first and last: this machine's noise
    times = latencies([LogitsOnly(m).eval() for m in timed], x)
    rows = []
    for (name, model), time_s in zip([*variants.items(), (FP32_AGAIN, timed[-1])], times, strict=True):
        exact, perplexity = _quality(model, scored) if name != FP32_AGAIN else (math.nan, math.nan)
        rows.append({"variant": name, "model_size_bytes": measure.model_size_bytes(model),
                     "latency_per_token_s": time_s / x.numel(), "exact_match": exact, "perplexity": perplexity,
                     "scored_rows": len(scored)})
    frame = pd.DataFrame(rows)
    frame["size_ratio"] = frame.model_size_bytes / frame.model_size_bytes.iloc[0]
    frame["vs_fp32"] = frame.latency_per_token_s / frame.latency_per_token_s.iloc[0]
    frame.insert(1, "model", cfg.model)
    frame["tied"] = models.output_layer_tied(fp32)  # int8 on a tied output layer adds a copy
    return frame
