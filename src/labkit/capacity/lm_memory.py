"""What fine-tuning a decoder language model needs in memory, by formula: full fine-tuning, LoRA or QLoRA, for any
`labkit.models.DecoderShape` (a hub name, labkit's Llamas, or a shape written out).

Categories `lm_training_memory` returns, in bytes:

- ``weights``: the base model (fp32; 16-bit for a LoRA base in half precision; QLoRA: the decoder layers' linear
  weights in NF4, 0.5 bytes each, plus double quantization's constants, an 8-bit absmax per 64 weights and an fp32
  one per 256 of those, 0.516 bytes in all (Dettmers et al. 2023, *QLoRA*); embeddings, norms and an untied output
  layer stay 16-bit), the LoRA adapters in fp32, and under autocast (``bf16``/``fp16`` full fine-tuning, labkit's
  way) the half-precision copy of the weights autocast keeps for the step;
- ``gradients``, ``optimizer_state``: per trainable parameter (`training_memory`'s accounting, fp32 weights);
- ``activations``: what the decoder layers keep for the backward pass, counted tensor by tensor as transformers'
  Llama/Qwen2 layer saves them, per token: two RMSNorms (their fp32 input and normalized value, and the projection's
  input) ``2 h (8 + a)``, attention ``a (3 h + 2 kv) + 4 heads`` (rotated q, k, v, SDPA's output and log-sum-exp,
  o_proj's input), the SwiGLU MLP ``4 a i``, LoRA's ``a r`` per adapted projection; eager attention adds its
  probabilities, ``heads x L`` per token (fp32 from the softmax, plus a half copy under autocast) and the keys and
  values repeated to every head (GQA). ``a`` is 4 bytes in fp32, 2 in half precision. Per-layer checkpointing keeps
  each layer's input (fp32 residual) and recomputes one layer at a time. The method is Korthikanti et al. 2022,
  *Reducing Activation Recomputation in Large Transformer Models* (section 4.1: bytes per token per layer,
  ``s b h (34 + 5 a s / h)`` for GPT-3's layer in 16 bits), redone for a Llama layer without dropout;
- ``logits``: rows x length x vocabulary values in fp32 three times (the log-probabilities the loss keeps, their
  gradient, the logits' gradient), alive at the start of the backward pass; under autocast the half logits are freed
  once upcast for the loss, before it. The chunked loss keeps one slice's.

The ``total`` is the peak: weights + optimizer state + the larger of the activations (the backward pass starts
with all of them and no gradient) and the gradients plus one layer's activations (its end). Error: within 5 % of the
peak labkit measures (`labkit.fit`'s ``peak_memory_bytes``) for fp32 runs of tiny_llama and tiny_llama_10m on a CPU,
with and without checkpointing, SDPA and eager, at 512 tokens per step (measured: -0.8 % to +2.2 %; the test in
tests/test_capacity_lm.py allows 5 %). Half precision, QLoRA's dequantized temporaries
(one layer's weight in 16 bits at a time), the CUDA allocator's caching and library workspaces are not measured
here: count 10-20 % more on a GPU.
"""

from __future__ import annotations

from dataclasses import replace

from ..choices import ATTN_IMPLEMENTATIONS, check_choice
from ..errors import ConfigError
from ..models.hub import HUB_MODELS, DecoderShape, built_shape
from ..models.language import LANGUAGE_MODELS
from ..validate import is_int
from .accounting import training_memory

METHODS = ("full", "lora", "qlora")
LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit weights, an 8-bit absmax per 64, an fp32 absmax per 256 absmaxes
_HALF = {"fp32": 4, "bf16": 2, "fp16": 2}


def decoder_shape(model: str | DecoderShape, vocab_size: int | None = None) -> DecoderShape:
    """The `DecoderShape` of ``model``: a hub name (the shape built here, `labkit.models.hub.built_shape`), one of
    labkit's Llamas (``vocab_size`` needed) or a shape.

    Example:
        >>> decoder_shape("tiny_llama", vocab_size=2048).num_parameters()
    """
    if isinstance(model, DecoderShape):
        shape = model
    elif model in HUB_MODELS:
        shape = built_shape(model)  # what labkit builds under that name here (shrunk under $LABKIT_SHRINK)
    elif model in LANGUAGE_MODELS:
        if vocab_size is None:
            raise ConfigError("vocab_size", None, f"the tokenizer's vocabulary size for {model} (e.g. 2048)")
        spec = LANGUAGE_MODELS[model]
        shape = DecoderShape(spec.hidden_size, spec.intermediate_size, spec.num_hidden_layers,
                             spec.num_attention_heads, spec.num_attention_heads, vocab_size, False,
                             spec.max_position_embeddings)
    else:
        raise ConfigError("model", model, f"a DecoderShape or one of {[*LANGUAGE_MODELS, *HUB_MODELS]}")
    return shape if vocab_size is None else replace(shape, vocab_size=vocab_size)


def lora_parameters(shape: DecoderShape, rank: int, targets=("q_proj", "v_proj")) -> int:
    """LoRA's parameters: rank x (inputs + outputs) per adapted projection, in every decoder layer.

    Args:
        shape: the model. rank: the adapters' rank. targets: projection names, or ``"all"`` (every linear layer).
    """
    targets = LINEAR_TARGETS if targets == "all" else tuple(targets)
    bad = [t for t in targets if t not in LINEAR_TARGETS]
    if bad or not targets:
        raise ConfigError("lora_targets", list(targets), f"'all' or names from {list(LINEAR_TARGETS)}")
    h, i, kv, q = shape.hidden_size, shape.intermediate_size, shape.num_key_value_heads * shape.head_dim, shape.q_width
    sizes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
             "up_proj": (h, i), "down_proj": (i, h)}
    return shape.num_hidden_layers * sum(rank * sum(sizes[t]) for t in targets)


def layer_activation_bytes(shape: DecoderShape, precision: str = "fp32", attn_implementation: str = "sdpa",
                           seq_len: int = 512, lora_rank: int = 0, lora_targets=(), masked: bool = True) -> float:
    """Bytes one decoder layer keeps per token for the backward pass (see the module docstring for the terms).

    With ``lora_rank`` the base is frozen, and a frozen Linear keeps no input (its weight takes no gradient): a
    projection's input is kept only where an adapter reads it, the RMSNorms keep only their fp32 input. ``masked``:
    the batch has padding, so SDPA gets a mask, which it keeps per layer in the queries' dtype (``seq_len`` values a
    token), and transformers repeats the keys and values to every head (SDPA's GQA takes no mask).
    """
    a, h, i = _HALF[precision], shape.hidden_size, shape.intermediate_size
    kv, q, heads = shape.num_key_value_heads * shape.head_dim, shape.q_width, shape.num_attention_heads
    adapted = set(lora_targets)
    if attn_implementation == "eager":  # q, k and v repeated to every head, the probabilities (fp32 from the
        # softmax, plus their half copy under autocast) and o_proj's input, a copy, where its weight or adapter needs it
        attention = 3 * a * q + heads * seq_len * (4 + (a if a != 4 else 0))
        attention += a * q * (not lora_rank or "o_proj" in adapted)
    else:  # rotated q, k and v, SDPA's output (it is o_proj's input) and log-sum-exp, the mask it was given
        attention = a * (2 * q + 2 * (q if masked else kv)) + 4 * heads + (a * seq_len if masked else 0)
    # A projection's input: in fp32 the norm's output, shared by q, k, v (gate, up); under autocast each projection
    # casts it to 16 bits itself, one copy each.
    def inputs(names):
        reading = len(names if not lora_rank else adapted & names)
        return a * h * (min(reading, 1) if a == 4 else reading)

    if not lora_rank:  # the norms' fp32 input and normalized value, the projections' inputs; the SwiGLU MLP
        return 2 * 8 * h + inputs({"q_proj", "k_proj", "v_proj"}) + inputs({"gate_proj", "up_proj"}) + attention \
            + 4 * a * i
    per_token = 2 * 4 * h + attention + 3 * a * i  # the norms' fp32 inputs; gate's, up's and SiLU's outputs
    per_token += inputs({"q_proj", "k_proj", "v_proj"}) + inputs({"gate_proj", "up_proj"})
    return per_token + a * i * ("down_proj" in adapted) + a * lora_rank * len(adapted)  # and each adapter's A x


def lm_training_memory(model: str | DecoderShape, method: str = "full", seq_len: int = 512, micro_batch: int = 1,
                       precision: str = "fp32", optimizer: str = "adamw", lora_rank: int = 16,
                       lora_targets=("q_proj", "v_proj"), checkpointing: bool = False,
                       attn_implementation: str = "sdpa", vocab_size: int | None = None, masked: bool = True,
                       loss_chunks: int | None = None, half_base: bool = True, adapter_bytes: int = 4,
                       shards: int = 1, foreach: bool = True) -> dict:
    """A language model's fine-tuning memory by category and its peak (``total``), in bytes (module docstring).

    Args:
        model: a hub name (`labkit.models.hub_models()`), a labkit Llama (with ``vocab_size``) or a `DecoderShape`.
        method: ``full``, ``lora`` or ``qlora``. seq_len, micro_batch: tokens per row and rows per micro-batch.
        precision: ``fp32``, or ``bf16``/``fp16`` autocast. optimizer: `training_memory`'s (``adamw``, ...).
        lora_rank, lora_targets: the adapters (``"all"``: every linear layer). checkpointing: per decoder layer.
        attn_implementation: ``sdpa`` or ``eager``. vocab_size: the tokenizer's (labkit's Llamas; None: the model's).
        masked: the batch has padding (`layer_activation_bytes`); False for rows of one length (packed, all cut).
        half_base: LoRA's frozen base stored in 16 bits under autocast (PEFT with ``torch_dtype``); False: float32, as
            labkit's LoRA keeps it, with autocast's 16-bit copy of each weight kept for the backward pass.
        adapter_bytes: the LoRA adapters' bytes per value (4: float32, labkit's; 2: 16-bit): float32 adapters under
            autocast take their input in float32, and its gradient comes back in float32 through the backward.
        loss_chunks: the output layer and the loss a slice at a time (`labkit.techniques.chunked_loss`): one slice's
            logits alive instead of all of them.
        foreach: AdamW's step runs over every tensor at once (torch's default on a GPU), with a temporary the size
            of all trainable weights; False (a CPU's default): one tensor at a time, a few temporaries of the largest.
        shards: one rank of FSDP2 over this many (labkit's units: each decoder layer, then the root). A rank keeps
            1/N of the stored weights, the gradients and the optimizer state, plus what is gathered whole: the
            root (embeddings, final norm, output layer) from its forward to the end of the backward (FSDP2 does not
            reshard the root after its forward), two layers at once (the backward gathers the next ahead), and a
            layer's gradient until it is reduce-scattered, the root's until the backward ends.

    Example:
        >>> lm_training_memory("qwen2.5_1.5b", "qlora", seq_len=512, precision="fp16")["total"] / 2**30
    """
    shape = decoder_shape(model, vocab_size)
    if method not in METHODS:
        raise ConfigError("method", method, f"one of {list(METHODS)}")
    if precision not in _HALF:
        raise ConfigError("precision", precision, f"one of {list(_HALF)} (bf16/fp16: autocast)")
    check_choice("attn_implementation", attn_implementation, ATTN_IMPLEMENTATIONS)
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("loss_chunks", loss_chunks or 1),
                        ("shards", shards)):
        if not is_int(value) or value < 1:
            raise ConfigError(name, value, "a positive integer")
    a, n = _HALF[precision], shape.num_parameters()
    targets = () if method == "full" else (LINEAR_TARGETS if lora_targets == "all" else tuple(lora_targets))
    rank = 0 if method == "full" else lora_rank
    one_layer = sum(shape.layer_linear_params().values())
    output = shape.vocab_size * shape.hidden_size  # the output layer's weight (the embeddings' where tied)
    if method == "full":
        state = training_memory(n, "fp32", optimizer)
        # autocast's half copy of every weight, kept for the backward pass; checkpointed, the forward keeps none and
        # the backward recasts one layer at a time (and the output layer)
        stored, copies = state["weights"], (2 * (one_layer + output if checkpointing else n) if a == 2 else 0)
    else:
        adapters = lora_parameters(shape, rank, targets)
        state = training_memory(adapters, "fp32", optimizer)
        base = 2 if a == 2 and (half_base or method == "qlora") else 4
        linear = shape.num_hidden_layers * sum(shape.layer_linear_params().values())
        stored = state["weights"] + (NF4_BYTES if method == "qlora" else base) * linear + base * (n - linear)
        # autocast's copies of the float32 base's weights, kept for the backward (checkpointed: one layer's)
        # (and the output layer's, which no checkpoint covers)
        copies = 2 * ((one_layer if checkpointing else linear) + output) if a == 2 and base == 4 else 0
    h = shape.hidden_size
    # FSDP2: the rank's shard of everything stored, the root gathered whole through the step, and a layer's weights
    # while it runs (a layer's backward gathers the next one's ahead)
    root = stored / n * (output * (1 if shape.tie_word_embeddings else 2) + h) if shards > 1 else 0
    gathered_layer = stored / n * (one_layer + 2 * h) if shards > 1 else 0
    weights = stored / shards + root + copies
    layer = layer_activation_bytes(shape, precision, attn_implementation, seq_len, rank, targets, masked)
    tokens, h, count = seq_len * micro_batch, shape.hidden_size, shape.num_hidden_layers
    kept = tokens * 4 * h * count if checkpointing else 0  # each layer's input
    layers = tokens * layer * (1 if checkpointing else count)  # one recomputed at a time
    if rank and not checkpointing:  # below the first adapter nothing needs a gradient: layer 0's norm keeps nothing
        layers -= tokens * 4 * h
    # the final RMSNorm's fp32 input, and with a trained output layer its normalized value and the layer's input
    final_norm = tokens * h * (4 if rank else 8 + a)
    mask = tokens * seq_len if masked and attn_implementation == "sdpa" else 0  # the boolean padding mask, L x L a row
    out = {"weights": weights, "gradients": state["gradients"], "optimizer_state": state["optimizer_state"] / shards,
           "activations": kept + layers + final_norm + mask,
           "logits": tokens * shape.vocab_size * 12 / (loss_chunks or 1)}
    out = {k: int(round(v)) for k, v in out.items()}
    # A layer's backward holds, beyond what the layer kept, the MLP's gradients (two of its width) and the hidden
    # state's gradient with its residual copy (fp32); the embeddings' and output layer's gradients come first.
    backward = tokens * (2 * a * shape.intermediate_size + 8 * h)
    if rank and a == 2 and adapter_bytes == 4 and "down_proj" in targets:  # down_proj's adapter input's float32 grad
        backward += tokens * 4 * shape.intermediate_size
    head_grads = out["gradients"] - (0 if rank else 4 * count * (sum(shape.layer_linear_params().values()) + 2 * h))
    # The peak is at the start of the backward pass (checkpointed: the loss's backward is over before the first layer
    # is recomputed), in the top layer's backward (every activation still kept) or in the bottom one's (every gradient).
    start = kept + mask + (max(out["logits"] + final_norm, layers) if checkpointing else
                           layers + final_norm + out["logits"])
    top = head_grads + kept + mask + layers + backward + 2 * gathered_layer
    # the bottom layer's own gradients are made in its backward, the MLP's first
    # (FSDP2: the layers' gradients below the top are shards by then; the root's still whole)
    bottom = head_grads + (out["gradients"] - head_grads) * (count - 1) / count / shards + mask + backward + tokens * (
        layer + (4 * h if checkpointing else 0)) + gathered_layer
    out["gradients"] = int(round(out["gradients"] / shards))  # what a rank keeps between steps
    # the optimizer step: every gradient, and AdamW's temporaries (its sqrt of the second moment, then the update)
    largest = 4 * (output if method == "full" else max(rank * max(h, shape.intermediate_size), 1))
    temporaries = (out["gradients"] if foreach else 3 * largest / shards) if optimizer == "adamw" else 0
    step = out["gradients"] + temporaries
    out["total"] = out["weights"] + out["optimizer_state"] + int(max(start, top, bottom, step))
    return out
