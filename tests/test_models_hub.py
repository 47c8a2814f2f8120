"""Hub language models by name (`labkit.models.hub`): their architectures, the offline path (config-built, random
weights, a loud warning) and the online path (own tokenizer, then downloaded weights), faked here without a network."""

import pytest
import torch

import labkit
from labkit import models, text
from labkit.errors import ConfigError
from labkit.train import fit

transformers = pytest.importorskip("transformers")

TINY = {"num_hidden_layers": 2, "vocab_size": 2048}  # the same code path, a model that trains in a second


def test_the_full_size_model_is_the_shape_labkit_writes_out(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    model, weights = models.build_language_model("smollm2_135m", 2048, tokenizer=text.pydoc_bpe())
    shape = models.HUB_MODELS["smollm2_135m"].shape
    # 134.5M is SmolLM2-135M's published size; tied embeddings: one vocab x hidden matrix
    assert model.num_parameters() == shape.num_parameters() == 134_515_008
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert (model.config.num_key_value_heads, model.config.vocab_size) == (3, 49152)
    assert weights.source == "random" and "NO PRETRAINED WEIGHTS for smollm2_135m" in weights.warning
    assert "$LABKIT_OFFLINE is set" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "low", "high"), [("qwen2.5_0.5b", 0.49e9, 0.50e9), ("qwen2.5_1.5b", 1.53e9, 1.55e9)])
def test_qwen_shapes_count_their_published_sizes(name, low, high):
    shape = models.HUB_MODELS[name].shape
    assert low < shape.num_parameters() < high  # the model cards: 0.49B and 1.54B
    one_layer, _, _ = models.build_hub_model(name, num_hidden_layers=1, vocab_size=64, pretrained=False)
    expected = models.DecoderShape(**{**shape.__dict__, "num_hidden_layers": 1, "vocab_size": 64}).num_parameters()
    assert one_layer.num_parameters() == expected and type(one_layer).__name__ == "Qwen2ForCausalLM"


def test_unknown_names_and_too_large_vocabularies_are_refused():
    with pytest.raises(ConfigError, match=r"model='smollm3'.*smollm2_135m"):
        models.build_hub_model("smollm3")
    with pytest.raises(ConfigError, match=r"model='llama_7b'.*tiny_llama.*smollm2_135m"):
        labkit.RunConfig(model="llama_7b", dataset="pydoc_text")
    with pytest.raises(ConfigError, match="at most 2048"):
        models.build_hub_model("smollm2_135m", data_vocab_size=4096, pretrained=False, **TINY)


def test_offline_a_hub_model_trains_on_pydoc_text(monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    torch.manual_seed(0)
    model, source, warning = models.build_hub_model("smollm2_135m", data_vocab_size=2048, tokenizer_name="pydoc_bpe",
                                                    **TINY)
    assert source == "random" and "RANDOM weights" in warning
    cfg = labkit.RunConfig(model="smollm2_135m", dataset="pydoc_text", seq_len=32, batch_size=2, max_steps=6,
                           train_size=16, evaluate=False, lr=3e-3)
    res = fit(cfg, model=model, progress=False)
    assert res.losses[-1] < res.losses[0] and res.tokens_per_s > 0 and res.peak_memory_bytes > 0


def _fake_hub(monkeypatch, calls):
    """The hub as a download would answer: labkit's BPE as a transformers tokenizer, a small model as the weights."""
    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    monkeypatch.setattr(models.hub, "host_answers", lambda host: True)

    def tokenizer(repo, **kwargs):
        calls.append(("tokenizer", repo, kwargs.get("revision")))
        return transformers.PreTrainedTokenizerFast(tokenizer_object=text.pydoc_bpe().backend, bos_token="<bos>",
                                                    eos_token="<eos>", pad_token="<pad>")

    def weights(repo, **kwargs):
        calls.append(("weights", repo, kwargs.get("dtype"), kwargs.get("revision")))
        config = models.hub_config("smollm2_135m", kwargs["attn_implementation"], **TINY)
        return transformers.AutoModelForCausalLM.from_config(config)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", weights)


def test_online_the_data_is_tokenized_by_the_hub_tokenizer_and_the_weights_load(monkeypatch):
    calls = []
    _fake_hub(monkeypatch, calls)
    repo = models.HUB_MODELS["smollm2_135m"].repo
    cfg = labkit.RunConfig(model="smollm2_135m", dataset="pydoc_text", seq_len=32, batch_size=2, max_steps=4,
                           train_size=8, evaluate=False)
    splits = labkit.train.run_splits(cfg)
    assert splits["train"].tokenizer.name == repo and splits["train"].input_ids[0][0] == text.BOS_ID
    model, weights = models.build_language_model("smollm2_135m", 2048, tokenizer=splits["train"].tokenizer)
    assert weights.source == f"hub:{repo}" and weights.warning is None
    revision = models.HUB_MODELS["smollm2_135m"].revision  # a pinned commit: a later push to the repo changes nothing
    assert len(revision) == 40 and calls == [("tokenizer", repo, revision), ("weights", repo, torch.float32, revision)]
    # the BPE's own name is not the repo's: its ids would mean other tokens to downloaded weights
    _, weights = models.build_language_model("smollm2_135m", 2048, tokenizer=text.pydoc_bpe())
    assert weights.source == "random" and "not HuggingFaceTB/SmolLM2-135M's tokenizer" in weights.warning
    assert len(calls) == 2


def test_online_without_an_answer_from_the_hub_labkit_gives_up_in_seconds(monkeypatch):
    # Kaggle with Internet off and $LABKIT_OFFLINE unset: no download is tried, the reason is said
    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    asked = []
    monkeypatch.setattr(models.hub, "host_answers", lambda host: asked.append(host) or False)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("downloaded"))
    tokenizer, why = models.hub_tokenizer("qwen2.5_0.5b")
    assert tokenizer is None and asked == ["huggingface.co"] and "did not answer within 3 s" in why


def test_every_hub_model_is_pinned_to_a_commit():
    assert all(len(spec.revision) == 40 and int(spec.revision, 16) for spec in models.HUB_MODELS.values())


def test_the_weights_dtype_is_passed_by_the_name_the_installed_transformers_takes():
    # transformers 4.56 renamed torch_dtype to dtype and warns on the old name: a stderr box in a notebook
    assert [models.hub.dtype_argument(v) for v in ("4.45.2", "4.55.4", "4.56.0", "4.57.1", "5.15.0")] == \
        ["torch_dtype", "torch_dtype", "dtype", "dtype", "dtype"]


@pytest.mark.parametrize("name", list(models.HUB_MODELS))
def test_shrunk_hub_models_keep_their_architecture(monkeypatch, name):
    # `full`'s code path on a CPU (LABKIT_SHRINK): few layers and a narrow width, the same kind of model
    real = models.HUB_MODELS[name].shape
    monkeypatch.setenv("LABKIT_SHRINK", "1")
    shape = models.hub.built_shape(name)
    assert shape == models.hub.shrunk_shape(real) and shape.num_hidden_layers == 2
    assert (shape.num_attention_heads, shape.num_key_value_heads) == (real.num_attention_heads,
                                                                       real.num_key_value_heads)  # GQA kept
    assert (shape.tie_word_embeddings, shape.attention_bias) == (real.tie_word_embeddings, real.attention_bias)
    assert shape.intermediate_size % 64 == 0 and 2048 <= shape.vocab_size <= real.vocab_size  # pydoc_text's BPE fits
    model, source, _ = models.build_hub_model(name, pretrained=False)
    assert model.num_parameters() == shape.num_parameters() < 1e7 and source == "random"
    assert models.output_layer_tied(model) == real.tie_word_embeddings
    attention = model.model.layers[0].self_attn
    assert (attention.q_proj.bias is not None) == real.attention_bias  # Qwen's q/k/v biases
    assert attention.v_proj.out_features >= 64  # LoRA's rank 64 at `full` fits it
    monkeypatch.delenv("LABKIT_SHRINK")
    assert models.hub.built_shape(name) == real


def test_a_shrunk_hub_model_never_downloads(monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    monkeypatch.setenv("LABKIT_SHRINK", "1")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("downloaded"))
    tokenizer, why = models.hub_tokenizer("smollm2_135m")
    assert tokenizer is None and "$LABKIT_SHRINK is set" in why
    _, source, warning = models.build_hub_model("smollm2_135m", tokenizer_name="HuggingFaceTB/SmolLM2-135M")
    assert source == "random" and "built shrunk" in warning
