"""labkit's Llama language models: built by name from a config, offline, transformers imported only when built."""

import subprocess
import sys

import pytest
import torch

from labkit import models
from labkit.errors import ConfigError
from labkit.techniques.freezing import freeze

pytest.importorskip("transformers")


def test_import_labkit_does_not_import_transformers():
    code = "import sys, labkit, labkit.models; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(("name", "low", "high"), [("tiny_llama", 0.7e6, 1.4e6), ("tiny_llama_10m", 9e6, 12e6)])
def test_sizes_and_weights(name, low, high):
    model, weights = models.build_language_model(name, vocab_size=16, pretrained=False)
    assert low < model.num_parameters() < high
    assert weights.source == "random" and weights.warning is None
    assert model.labkit_name == name and model.config.pad_token_id == 0
    assert model.config.max_position_embeddings == models.max_positions(name) >= 128


def test_the_shipped_checkpoint_loads_whole_for_the_digits_and_without_embeddings_for_the_bpe(capsys):
    model, weights = models.build_language_model("tiny_llama", vocab_size=16)
    assert weights.source == "labkit:tiny_llama.pt" and weights.warning is None
    state = models.load_checkpoint("tiny_llama")  # sha256 checked against the manifest
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert models.checkpoint_dir().joinpath("tiny_llama.pt").stat().st_size < 5 * 2**20
    bpe, weights = models.build_language_model("tiny_llama", vocab_size=2048)
    assert weights.source == "labkit:tiny_llama.pt"
    assert "token embeddings and output layer are new" in capsys.readouterr().out
    layer = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(bpe.state_dict()[layer], state[layer]) and bpe.lm_head.weight.shape[0] == 2048


def test_the_10m_model_never_ships_and_says_so():
    _, weights = models.build_language_model("tiny_llama_10m", vocab_size=16)
    assert weights.source == "random" and "NO PRETRAINED WEIGHTS for tiny_llama_10m" in weights.warning
    assert "use tiny_llama for a pretrained start" in weights.warning


def test_a_missing_checkpoint_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CHECKPOINT_DIR", str(tmp_path))
    _, weights = models.build_language_model("tiny_llama", vocab_size=16)
    assert weights.source == "random" and "`labkit pretrain tiny_llama`" in weights.warning


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_attention_implementations_agree(impl):
    torch.manual_seed(0)
    model, _ = models.build_language_model("tiny_llama", vocab_size=16, pretrained=False, attn_implementation=impl)
    assert model.config._attn_implementation == impl
    ids = torch.randint(3, 16, (2, 20))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
        model.set_attn_implementation("sdpa")
        assert torch.allclose(model(input_ids=ids, use_cache=False).logits, logits, atol=1e-5)


def test_stages_cover_every_parameter_once_and_freeze():
    model, _ = models.build_language_model("tiny_llama", vocab_size=16, pretrained=False)
    stages = models.named_stages(model)
    assert [name for name, _ in stages] == ["embed", "layer0", "layer1", "layer2", "layer3", "head"]
    assert sum(p.numel() for _, s in stages for p in s.parameters()) == model.num_parameters()
    freeze(model, "head_only")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"model.norm.weight", "lm_head.weight"}


def test_bad_names():
    with pytest.raises(ConfigError, match=r"model='gpt5'.*tiny_llama"):
        models.build_language_model("gpt5", vocab_size=16)
    with pytest.raises(ConfigError, match=r"attn_implementation='flash'.*\['sdpa', 'eager'\]"):
        models.build_language_model("tiny_llama", vocab_size=16, attn_implementation="flash")
    with pytest.raises(ConfigError, match="vocab_size=2"):
        models.build_language_model("tiny_llama", vocab_size=2)
