"""Packed rows on a transformers Llama give each document the loss it has alone (random weights, no hub, CPU)."""

import pytest
import torch
import torch.nn.functional as F

from labkit import text

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama():
    config = transformers.LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).train()  # train mode: where the default cache bites


@pytest.fixture(scope="module")
def examples():
    train = text.load_text_splits("digits_sort", 3, 1, 1, seq_len=32, seed=0)["train"]
    return [train[i] for i in range(3)]


def _loss_sum_per_document(logits: torch.Tensor, batch: text.TokenBatch) -> list[float]:
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch.labels[:, 1:], reduction="none")
    documents = batch.document_ids[:, 1:]
    return [float(losses[documents == d].sum()) for d in range(int(documents.max()) + 1)]


@torch.no_grad()
def test_packed_documents_get_their_separate_loss_only_without_a_cache(llama, examples):
    alone = [_loss_sum_per_document(llama(**text.collate([e]).model_inputs()).logits, text.collate([e]))[0]
             for e in examples]
    packed = text.collate(examples, packing="pack", seq_len=64)
    assert packed.input_ids.shape[0] == 1  # all three in one row
    inputs = packed.model_inputs()
    out = llama(**inputs)
    assert _loss_sum_per_document(out.logits, packed) == pytest.approx(alone, rel=1e-5)
    # The mean loss transformers returns divides by the label tokens labkit counts.
    assert float(out.loss) == pytest.approx(sum(alone) / packed.counts().label_tokens, rel=1e-5)
    # The default use_cache=True (in train mode too): the later documents attend to the earlier ones.
    leaky = llama(**{k: v for k, v in inputs.items() if k != "use_cache"})
    assert (leaky.logits - out.logits).abs().max() > 1e-2
    assert _loss_sum_per_document(leaky.logits, packed)[1:] != pytest.approx(alone[1:], rel=1e-3)
    # The block-diagonal mask given explicitly (what a loop on transformers 4 would pass) agrees too.
    masked = llama(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                   attention_mask=packed.block_causal_mask())
    assert _loss_sum_per_document(masked.logits, packed) == pytest.approx(alone, rel=1e-5)
