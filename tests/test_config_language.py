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
    ({"loss_chunks": 4}, r"loss_chunks=4.*issue 28's next slice"),
    ({"compile": True}, r"compile=True.*issue 28's next slice"),
    ({"compile": "yes"}, r"compile='yes'.*True or False"),
    ({"checkpointing": True}, r"checkpointing=True.*issue 28's next slice"),
    ({"lora_rank": 8}, r"lora_rank=8.*issue 28's next slice"),
])
def test_bad_language_values(changes, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**{**LM, **changes})


@pytest.mark.parametrize(("changes", "match"), [
    ({"seq_len": 64}, r"seq_len=64.*None.*vision model"),
    ({"packing": "pack"}, r"packing='pack'.*'pad'.*vision model"),
    ({"attn_implementation": "eager"}, r"attn_implementation='eager'.*vision model"),
    ({"dataset": "digits_sort"}, r"dataset='digits_sort'.*\['cifar10', 'shapes10', 'shapes_source'\]"),
])
def test_vision_configs_refuse_language_fields(changes, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(model="small_cnn", **changes)


def test_optimizer_impl_on_a_vision_run():
    assert RunConfig(optimizer="sgd", optimizer_impl="foreach").optimizer_impl == "foreach"
