"""The language-model mechanisms on their own: chunked cross-entropy (same loss and gradients as one
cross-entropy, less memory), per-decoder-layer checkpointing under transformers 4's or 5's name, compiling."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from labkit import measure
from labkit.choices import check_loss_chunks
from labkit.errors import ConfigError
from labkit.techniques import chunked_loss, compiling, layer_checkpointing
from labkit.techniques.token_loss import token_loss_sum

transformers = pytest.importorskip("transformers")


def _hidden_and_labels(rows=3, width=16, hidden=8, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(rows, width, hidden, generator=g, requires_grad=True)
    labels = torch.randint(0, vocab, (rows, width), generator=g)
    labels[:, :5] = -100  # a prompt without loss
    return states, labels


@pytest.mark.parametrize("chunks", [1, 3, 5, 15])
def test_chunked_loss_equals_one_cross_entropy_with_its_gradients(chunks):
    torch.manual_seed(0)
    head = nn.Linear(8, 50, bias=False)
    states, labels = _hidden_and_labels()
    expected = token_loss_sum(head(states), labels)
    expected.backward()
    grads = states.grad.clone(), head.weight.grad.clone()
    states.grad = head.weight.grad = None
    got = chunked_loss.chunked_loss_sum(states, head, labels, chunks)
    got.backward()
    assert torch.allclose(got, expected, rtol=1e-5)
    assert torch.allclose(states.grad, grads[0], atol=1e-6) and torch.allclose(head.weight.grad, grads[1], atol=1e-6)


def test_chunked_loss_runs_a_wrapped_head_as_a_module():
    class Scaled(nn.Module):  # stands for a LoRA layer around the head
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(8, 50)

        def forward(self, x):
            return 2 * self.inner(x)

    torch.manual_seed(0)
    head = Scaled()
    states, labels = _hidden_and_labels()
    expected = token_loss_sum(head(states), labels)
    assert torch.allclose(chunked_loss.chunked_loss_sum(states, head, labels, 3), expected, rtol=1e-5)


def test_chunked_loss_keeps_a_fraction_of_the_logits_memory():
    """4 x 512 tokens of a 4,096-token vocabulary: one cross-entropy holds every logit in float32 (and its
    gradient); 8 chunks hold one eighth at a time. Peaks from the memory tracker, loss and backward included."""
    torch.manual_seed(0)
    head = nn.Linear(64, 4096, bias=False)
    states = torch.randn(4, 512, 64, requires_grad=True)
    labels = torch.randint(0, 4096, (4, 512))

    def peak(loss_fn):
        def step():
            loss_fn().backward()
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1)  # no state: only the step's tensors count
        return measure.track_step_memory(step, head, optimizer, torch.device("cpu")).total_peak_bytes

    whole = peak(lambda: token_loss_sum(head(states), labels))
    chunked = peak(lambda: chunked_loss.chunked_loss_sum(states, head, labels, 8))
    logits = chunked_loss.logits_bytes(4, 512, 4096)
    assert logits == 32 * 2**20
    assert whole > logits and chunked < whole / 3, (whole, chunked)


def test_chunk_counts_must_divide_the_sequence():
    check_loss_chunks(None, 32)
    check_loss_chunks(8, 32)
    with pytest.raises(ConfigError, match=r"loss_chunks=3.*divisor of seq_len=32: \[1, 2, 4, 8, 16, 32\]"):
        check_loss_chunks(3, 32)
    with pytest.raises(ConfigError, match=r"loss_chunks=0.*integer >= 1"):
        check_loss_chunks(0, 32)


def _llama(layers=2):
    config = transformers.LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).train()


def _grads_after_step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_layer_checkpointing_gives_the_same_gradients_and_names_the_method():
    plain, checkpointed = _llama(), _llama()
    ids = torch.randint(0, 20, (2, 12))
    method = layer_checkpointing.checkpoint_decoder_layers(checkpointed)
    expected = ("activation_checkpointing_enable" if hasattr(checkpointed, "activation_checkpointing_enable")
                else "gradient_checkpointing_enable")
    assert method == expected and layer_checkpointing.is_checkpointing(checkpointed)
    assert not layer_checkpointing.is_checkpointing(plain)
    (loss_a, grads_a), (loss_b, grads_b) = _grads_after_step(plain, ids), _grads_after_step(checkpointed, ids)
    assert torch.allclose(loss_a, loss_b) and torch.allclose(grads_a, grads_b, atol=1e-6)


def test_layer_checkpointing_takes_transformers_4s_name_when_5s_is_missing():
    calls = []

    class OldModel(nn.Module):  # transformers 4: only gradient_checkpointing_enable
        supports_gradient_checkpointing = True

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(gradient_checkpointing_kwargs)

    assert layer_checkpointing.checkpoint_decoder_layers(OldModel()) == "gradient_checkpointing_enable"
    assert calls == [{"use_reentrant": False}]
    with pytest.raises(ConfigError, match=r"checkpointing=True.*False for Linear"):
        layer_checkpointing.checkpoint_decoder_layers(nn.Linear(2, 2))


def test_compile_problem_names_the_missing_compiler(monkeypatch):
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert "C++ compiler" in compiling.compile_problem(torch.device("cpu"))
    monkeypatch.setattr(compiling.importlib.util, "find_spec", lambda name: None)
    assert "Triton" in compiling.compile_problem(torch.device("cuda"))


def test_compile_decoder_refuses_a_model_without_layers():
    with pytest.raises(ConfigError, match=r"compile=True.*model.model.layers"):
        compiling.compile_decoder(nn.Linear(2, 2))


def test_logits_bytes_is_rows_times_width_times_vocabulary_in_float32():
    assert chunked_loss.logits_bytes(4, 512, 32768) == 4 * 512 * 32768 * 4
    assert F.cross_entropy  # the loss the chunks reproduce
