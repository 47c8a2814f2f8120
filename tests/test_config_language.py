"""RunConfig's language-model fields: defaults per dataset, and each bad value named with what is allowed."""

import pytest

from labkit import RunConfig
from labkit.errors import ConfigError
from labkit.text import PACKINGS

LM = {"model": "tiny_llama", "dataset": "digits_sort"}


def test_language_defaults_and_packing_choices():
    cfg = RunConfig(**LM, seq_len=64, packing="pack", attn_implementation="eager", optimizer_impl="fused")
    assert cfg.seq_len == 64 and cfg.packing == "pack" and cfg.compile is False
    assert RunConfig(**LM).seq_len is None  # the dataset's default (32 for the digit tasks)
    assert PACKINGS == ("pad", "pad_max", "pack")


@pytest.mark.parametrize(("changes", "match"), [
    ({"model": "gpt5"}, r"model='gpt5'.*tiny_llama"),
    ({"dataset": "wikitext"}, r"dataset='wikitext'.*digits_sort"),
    ({"dataset": "shapes10"}, r"dataset='shapes10'.*\['digits_source', 'digits_sort', 'pydoc_text'\]"),
    ({"packing": "ragged"}, r"packing='ragged'.*\['pad', 'pad_max', 'pack'\]"),
    ({"attn_implementation": "flash"}, r"attn_implementation='flash'.*\['sdpa', 'eager'\]"),
    ({"seq_len": 1}, r"seq_len=1.*integer >= 2"),
    ({"seq_len": 16}, r"seq_len=16.*at least 27 for digits_sort"),
    ({"seq_len": 512}, r"seq_len=512.*at most 256"),
    ({"optimizer_impl": "cuda"}, r"optimizer_impl='cuda'.*\['forloop', 'foreach', 'fused'\]"),
    ({"optimizer_impl": "fused", "optimizer": "adamw8bit"}, r"optimizer_impl='fused'.*None with optimizer"),
    ({"loss_chunks": 0}, r"loss_chunks=0.*integer >= 1"),
    ({"loss_chunks": 5}, r"loss_chunks=5.*a divisor of seq_len=32: \[1, 2, 4, 8, 16, 32\]"),
    ({"loss_chunks": 3, "seq_len": 64}, r"loss_chunks=3.*divisor of seq_len=64"),
    ({"compile": True}, r"compile=True.*False with packing='pad'.*\['pad_max', 'pack'\].*compiles the model again"),
    ({"compile": "yes", "packing": "pack"}, r"compile='yes'.*True or False"),
    ({"checkpointing": 2}, r"checkpointing=2.*False or True for the language model.*every decoder layer"),
    ({"quantize": "int8_dynamic"}, r"quantize='int8_dynamic'.*None for the language model.*vision models only"),
    ({"prune_amount": 0.5}, r"prune_amount=0.5.*None for the language model"),
])
def test_bad_language_values(changes, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**{**LM, **changes})


@pytest.mark.parametrize(("changes", "match"), [
    ({"seq_len": 64}, r"seq_len=64.*None.*vision model"),
    ({"packing": "pack"}, r"packing='pack'.*'pad'.*vision model"),
    ({"attn_implementation": "eager"}, r"attn_implementation='eager'.*vision model"),
    ({"loss_chunks": 4}, r"loss_chunks=4.*None.*vision model"),
    ({"compile": True}, r"compile=True.*False.*vision model"),
    ({"dataset": "digits_sort"}, r"dataset='digits_sort'.*\['cifar10', 'shapes10', 'shapes_source'\]"),
])
def test_vision_configs_refuse_language_fields(changes, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(model="small_cnn", **changes)


def test_optimizer_impl_on_a_vision_run():
    assert RunConfig(optimizer="sgd", optimizer_impl="foreach").optimizer_impl == "foreach"


def test_the_technique_fields_a_language_model_takes():
    cfg = RunConfig(**LM, packing="pack", compile=True, loss_chunks=4, checkpointing=True, lora_rank=8,
                    lora_targets=["q_proj", "v_proj"])
    assert (cfg.compile, cfg.loss_chunks, cfg.checkpointing, cfg.lora_targets) == (True, 4, True, ("q_proj", "v_proj"))
    assert RunConfig(**LM, packing="pad_max", compile=True).compile and RunConfig(**LM, freeze="head_only").freeze
