"""Section 8 of notebook 10: greedy generation with the KV cache against without, and the cache's bytes per token
(2 x layers x kv_heads x head_dim x bytes) for multi-head against grouped-query attention."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pandas as pd
import torch

from ...display import number
from ...env import profile, resolve_device
from ...labresult import LabResult
from ...measure import Measured, compare
from ...messages import worded
from ...models.language import LANGUAGE_MODELS, build_llama, transformers_module
from ...units import mib
from .common import interleaved


def _cache_of(model, output):
    # transformers 5 names it ``cache``, 4 ``past_key_values`` (the keyword too)
    return output["cache"] if "cache" in output else output["past_key_values"]


def _cache_keyword(model) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_tensors_bytes(cache) -> int:
    """Bytes of the key and value tensors a transformers cache holds, measured from the tensors themselves."""
    layers = getattr(cache, "layers", None)
    pairs = [(layer.keys, layer.values) for layer in layers] if layers is not None else \
        list(zip(cache.key_cache, cache.value_cache, strict=True))
    return sum(t.numel() * t.element_size() for pair in pairs for t in pair if t is not None)


def cache_bytes_per_token(config, bytes_per_value: int = 4) -> int:
    """The KV cache's bytes per token: 2 (K and V) x layers x kv_heads x head_dim x ``bytes_per_value``."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * bytes_per_value


@torch.no_grad()
def generate_greedy(model, prompt_ids: torch.Tensor, new_tokens: int, use_cache: bool = True):
    """``new_tokens`` greedy tokens after ``prompt_ids``: (all ids, the cache or None); with the cache each step
    feeds only the newest token, without it the whole sequence so far."""
    ids, cache, keyword = prompt_ids, None, _cache_keyword(model)
    for _ in range(new_tokens):
        if use_cache and cache is not None:
            output = model(input_ids=ids[:, -1:], use_cache=True, **{keyword: cache})
        else:
            output = model(input_ids=ids, use_cache=use_cache)
        cache = _cache_of(model, output) if use_cache else None
        ids = torch.cat([ids, output.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids, cache


@dataclass
class Generation(LabResult):
    """Greedy generation with and without the cache: tokens/s, time, same tokens, the cache's bytes."""

    shown = ("use_cache", "tokens_per_s", "time_s", "same_tokens", "cache_bytes", "formula_cache_bytes")

    @worded
    def finding(self) -> str:
        on, off = self.frame.set_index("use_cache").loc[True], self.frame.set_index("use_cache").loc[False]
        time = compare(Measured.row(on, "time_s"), Measured.row(off, "time_s"), words=("faster", "slower"))
        same = "the same tokens" if on["same_tokens"] else "DIFFERENT tokens"
        fits = "as the formula says" if on["cache_bytes"] == on["formula_cache_bytes"] else \
            f"against the formula's {mib(on['formula_cache_bytes'], '.3g')}"
        return (f"With the KV cache: {number(on['tokens_per_s'] / off['tokens_per_s'])}x the tokens/s "
                f"({time.verdict}; {number(on['tokens_per_s'])} against {number(off['tokens_per_s'])}), {same}; the "
                f"cache holds {mib(on['cache_bytes'], '.3g')}, {fits}.")


def generation_speed(model_name: str = "tiny_llama", prompt_len: int = 32, new_tokens: int | None = None,
                     repeats: int | None = None, seed: int = 0) -> Generation:
    """Greedy generation with and without the KV cache on a random-weight Llama, timed interleaved after one
    untimed run each (``new_tokens`` None: 32 at ``ci``, 96 otherwise; ``repeats`` None: the profile's, at most 8)."""
    prof = profile()
    new_tokens = (32 if prof.name == "ci" else 96) if new_tokens is None else new_tokens
    repeats = min(prof.repeats, 8) if repeats is None else repeats
    torch.manual_seed(seed)
    device = resolve_device("auto")  # the GPU where there is one: generation is timed where a learner runs it
    model = build_llama(model_name, vocab_size=2048).eval().to(device)
    prompt = torch.randint(3, 2048, (1, prompt_len), generator=torch.Generator().manual_seed(seed)).to(device)
    # the first generation of each kind is the warm-up (untimed); the timer synchronises a GPU before reading
    outputs = {flag: generate_greedy(model, prompt, new_tokens, use_cache=flag) for flag in (True, False)}
    times = interleaved({flag: (lambda flag=flag: generate_greedy(model, prompt, new_tokens, use_cache=flag))
                         for flag in outputs}, repeats, device, "time_s")
    cached = prompt_len + new_tokens - 1  # the last token generated is never fed back
    rows = [{"use_cache": flag, "tokens_per_s": new_tokens / times[flag]["time_s"], **times[flag],
             "same_tokens": bool(torch.equal(ids, outputs[False][0])),
             "cache_bytes": cache_tensors_bytes(cache) if cache is not None else 0,
             "formula_cache_bytes": cache_bytes_per_token(model.config) * cached if flag else 0}
            for flag, (ids, cache) in outputs.items()]
    return Generation(pd.DataFrame(rows))


@dataclass
class GqaCache(LabResult):
    """The cache of one Llama shape per query heads per KV head (1: multi-head): bytes per token, formula and
    measured, and the ratio to the first."""

    shown = ("attention", "kv_heads", "bytes_per_token", "measured_bytes_per_token")

    @worded
    def finding(self) -> str:
        base = self.frame.iloc[0]
        parts = [f"{row['attention']} ({_heads(row['kv_heads'])}) {number(row['bytes_per_token'])} bytes per token, "
                 f"{number(row['ratio'])}x" for _, row in self.frame.iloc[1:].iterrows()]
        return (f"{base['attention']} ({_heads(base['kv_heads'])}) caches {number(base['bytes_per_token'])} bytes "
                f"per token; " + "; ".join(parts) + ".")


def _heads(count) -> str:
    return f"{int(count)} KV head{'s' if count != 1 else ''}"


def gqa_cache_sizes(model_name: str = "tiny_llama", groups=(1, 4), tokens: int = 16) -> GqaCache:
    """`GqaCache` for ``model_name``'s shape with ``num_key_value_heads`` = heads / group (``groups`` divide the
    heads), each measured on ``tokens`` prompt tokens."""
    spec = LANGUAGE_MODELS[model_name]
    transformers = transformers_module(model_name)
    rows = []
    for group in groups:
        config = transformers.LlamaConfig(
            vocab_size=2048, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_attention_heads // group, max_position_embeddings=spec.max_position_embeddings)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        with torch.no_grad():
            cache = _cache_of(model, model(input_ids=torch.arange(3, 3 + tokens)[None], use_cache=True))
        rows.append({"attention": "MHA" if group == 1 else f"GQA-{group}", "kv_heads": config.num_key_value_heads,
                     "bytes_per_token": cache_bytes_per_token(config),
                     "measured_bytes_per_token": cache_tensors_bytes(cache) // tokens,
                     "num_params": sum(p.numel() for p in model.parameters())})
    frame = pd.DataFrame(rows)
    frame["ratio"] = frame["bytes_per_token"] / frame["bytes_per_token"].iloc[0]
    return GqaCache(frame)
