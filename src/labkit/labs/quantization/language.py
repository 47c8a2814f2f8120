"""Section 5 of notebook 06: int8 dynamic quantization of a fine-tuned language model's Linear layers, the classic
"quantize a fine-tuned BERT-class model for CPU inference" case.

`lm_quantization` takes the profile's fine-tuned language model (`labkit.workloads.lm_finetune_config`, cached with
its weights: notebook 08 trains the same one) and compares it in float32 with torch.ao's int8 dynamic quantization of
every Linear layer, and of every Linear but the output layer (the sensitive one: a logit's rounding flips the
argmax): file size, CPU latency per token (one forward pass over a batch of test prompts, the models timed in
turns, float32 twice for the noise), exact match and the answers' perplexity on the first `LM_EVAL_ROWS` test
examples (teacher-forced, float32 on the CPU).
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch

from ... import evaluation, measure, models, results, text, train
from ...config import RunConfig
from ...env import profile
from ...inference import LogitsOnly, latencies, prompt_ids
from ...messages import worded
from ...techniques import quantization
from ...techniques.precision import resolve_precision
from ...techniques.token_loss import forward_inputs, token_loss_sum
from ...units import mib
from ...workloads import lm_finetune_config

FP32, ALL_INT8, HEAD_FLOAT, FP32_AGAIN = ("fp32", "int8 dynamic, every Linear", "int8 dynamic, output layer float",
                                          "fp32, timed again")
LM_EVAL_ROWS = 256  # test examples scored: a 135M model on a free CPU scores a few hundred in seconds


def lm_quantization(cfg: RunConfig | None = None, refresh: bool = False) -> pd.DataFrame:
    """The fine-tuned language model in float32 and int8 dynamic (two choices of float layers), measured (cached).

    Args:
        cfg: the fine-tune (default `lm_finetune_config()`). refresh: fine-tune and measure again.

    Returns:
        DataFrame: variant, model_size_bytes, size_ratio, latency_per_token_s, vs_fp32 (latency), exact_match,
        perplexity (of the answers), scored_rows, tied (`labkit.models.output_layer_tied`: int8 on such an output
        layer keeps the float embeddings and adds an int8 copy).
    """
    cfg = cfg or lm_finetune_config()
    return results.cached_frame("quant-lm", [cfg], lambda: _measure(cfg, refresh), refresh=refresh,
                                rows=LM_EVAL_ROWS)


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
    for (name, model), latency in zip([*variants.items(), (FP32_AGAIN, timed[-1])], times, strict=True):
        exact, perplexity = _quality(model, scored) if name != FP32_AGAIN else (math.nan, math.nan)
        size = measure.model_size_bytes(model)
        rows.append({"variant": name, "model_size_bytes": size, "latency_per_token_s": latency / x.numel(),
                     "exact_match": exact, "perplexity": perplexity, "scored_rows": len(scored)})
    frame = pd.DataFrame(rows)
    frame["size_ratio"] = frame.model_size_bytes / frame.model_size_bytes.iloc[0]
    frame["vs_fp32"] = frame.latency_per_token_s / frame.latency_per_token_s.iloc[0]
    frame.insert(1, "model", cfg.model)
    frame["tied"] = models.output_layer_tied(fp32)  # int8 on a tied output layer adds a copy
    return frame


@worded
def lm_quantization_finding(frame: pd.DataFrame) -> str:
    """One line: the int8 files against fp32's, their latency against fp32's two timings, exact match, perplexity."""
    rows = frame.set_index("variant")
    fp32, again = rows.loc[FP32], rows.loc[FP32_AGAIN]
    noise = abs(again.latency_per_token_s - fp32.latency_per_token_s) / fp32.latency_per_token_s
    low = min(fp32.latency_per_token_s, again.latency_per_token_s) * (1 - noise)
    high = max(fp32.latency_per_token_s, again.latency_per_token_s) * (1 + noise)

    def speed(latency: float) -> str:
        return "within the noise" if low <= latency <= high else "slower" if latency > high else "faster"

    parts = [f"{name}: {mib(row.model_size_bytes, '.3g')} ({row.size_ratio:.2f}x), {row.vs_fp32:.2f}x the latency "
             f"({speed(row.latency_per_token_s)}), exact match {row.exact_match:.1%}, perplexity {row.perplexity:.3f}"
             for name, row in rows.loc[[ALL_INT8, HEAD_FLOAT]].iterrows()]
    tied = bool(rows.get("tied", pd.Series([False])).iloc[0])
    head = (" Its output layer is tied to the token embeddings, so int8 there adds a copy: the output layer kept "
            "float makes the smaller file." if tied else "")
    return (f"On {fp32.model} (fp32 {mib(fp32.model_size_bytes, '.3g')}, exact match {fp32.exact_match:.1%}, "
            f"perplexity {fp32.perplexity:.3f}; its two timings {noise:.0%} apart): " + "; ".join(parts) + "." + head)
