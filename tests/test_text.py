"""labkit.text: tokenizers, the language-model datasets and padded or packed batches (CPU, offline, seconds)."""

import sys

import pytest
import torch

from labkit import text
from labkit.errors import ConfigError, UnsupportedError

SEQ_LEN = 32


@pytest.fixture(scope="module")
def digits_sort():
    return text.load_text_splits("digits_sort", 256, 64, 64, seq_len=SEQ_LEN, seed=0)


def _examples(*lengths):
    """Hand-made examples: ids 10, 11, ... and labels equal to the ids (first token -100, as the datasets do)."""
    out, next_id = [], 10
    for n in lengths:
        ids = torch.arange(next_id, next_id + n)
        out.append({"input_ids": ids, "labels": torch.cat([torch.tensor([-100]), ids[1:]])})
        next_id += n
    return out


# --- tokenizers -----------------------------------------------------------------------------------


def test_char_tokenizer_round_trips_with_the_shared_special_ids():
    tok = text.tokenizer("chars")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 3 + len(text.DIGITS_CHARS))
    ids = tok.encode("31415>11345")
    assert ids[:2] == [6, 4] and tok.decode([1, *ids, 2, 0]) == "31415>11345"
    assert tok.decode([1, *ids], skip_special_tokens=False) == "<bos>31415>11345"
    with pytest.raises(ConfigError, match=r"text='x' is not allowed: characters of the 'chars' vocabulary"):
        tok.encode("12x")


def test_bpe_round_trips_any_text_and_keeps_the_special_ids():
    tok = text.tokenizer("pydoc_bpe")
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (text.DEFAULT_VOCAB_SIZE, 0, 1, 2)
    for sample in (text.pydoc_documents()[7], "naïve 東京 = {'a': 1}\n\ttabs  and  spaces"):
        assert tok.decode(tok.encode(sample)) == sample
    assert tok.decode([1, *tok.encode("x = 1"), 2], skip_special_tokens=False) == "<bos>x = 1<eos>"


def test_bpe_is_cached_under_the_data_dir_and_training_is_deterministic():
    tok = text.pydoc_bpe()
    assert tok.path == text.bpe_path() and tok.path.is_file() and text.pydoc_bpe() is tok
    assert tok.path.parent.parent == text.bpe.cache_dir()
    retrained = text.train_bpe(text.pydoc_documents(), text.DEFAULT_VOCAB_SIZE)
    reloaded = text.BPETokenizer(type(retrained).from_file(str(tok.path)))
    assert retrained.to_str() == reloaded.backend.to_str()  # the same vocabulary and merges as the cached file
    sample = text.pydoc_documents()[100]
    assert reloaded.encode(sample) == tok.encode(sample)


def test_bpe_without_the_tokenizers_library_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` raise ImportError
    with pytest.raises(UnsupportedError, match=r"tokenizer='pydoc_bpe' cannot run here: the 'tokenizers' library is "
                                               r"not installed .*pip install 'labkit-finetune\[lm\]'"):
        text.train_bpe(["a b c"], vocab_size=300)


def test_bad_tokenizer_names_and_sizes_are_refused():
    with pytest.raises(ConfigError, match=r"tokenizer='gpt2' is not allowed: one of \['chars', 'pydoc_bpe'\]"):
        text.tokenizer("gpt2")
    with pytest.raises(ConfigError, match=r"vocab_size=100 is not allowed: an integer >= 259"):
        text.pydoc_bpe(100)


def test_tokens_vs_chars_cuts_the_text_into_its_tokens():
    view = text.tokens_vs_chars("for x in range(3):")
    assert view.marked() == "for| x| in| range|(|3|):"
    assert (view.num_chars, view.num_tokens, round(view.chars_per_token, 2)) == (18, 7, 2.57)
    chars = text.tokens_vs_chars("31415>11345", "chars")
    assert (chars.num_tokens, chars.chars_per_token, chars.marked("")) == (11, 1.0, "31415>11345")


# --- datasets -------------------------------------------------------------------------------------


def test_digit_tasks_mask_everything_but_the_answer(digits_sort):
    tok = text.tokenizer("chars")
    source = text.load_text_splits("digits_source", 8, 4, 4, seq_len=SEQ_LEN)["train"]
    for data, task in ((digits_sort["train"], lambda d: "".join(sorted(d))), (source, lambda d: d[::-1])):
        for i in range(8):
            ids, labels, start = data.input_ids[i], data.labels[i], data.answer_start(i)
            prompt = tok.decode(ids[:start])
            assert prompt.endswith(">") and ids[0] == text.BOS_ID and ids[-1] == text.EOS_ID
            assert (labels[:start] == -100).all() and torch.equal(labels[start:], ids[start:])
            assert tok.decode(labels[start:]) == task(prompt[:-1])
            assert text.DIGITS_LENGTHS[0] <= start - 2 <= text.DIGITS_LENGTHS[1]


def test_digit_tasks_in_a_hub_tokenizer_hold_the_same_strings_and_mask_the_prompt(digits_sort, fake_hub_tokenizer):
    hub, chars = fake_hub_tokenizer(), text.tokenizer("chars")
    splits = text.load_text_splits("digits_sort", 256, 64, 64, seq_len=SEQ_LEN, seed=0, tokenizer=hub)
    for split in text.tasks.SPLITS:
        data, same = splits[split], digits_sort[split]
        assert data.tokenizer is hub and len(data) == len(same)
        assert [hub.decode(ids) for ids in data.input_ids] == [chars.decode(ids) for ids in same.input_ids]
        for i in range(len(data)):
            ids, labels, start = data.input_ids[i], data.labels[i], data.answer_start(i)
            digits = chars.decode(same.input_ids[i][:same.answer_start(i)])[:-1]
            assert ids.tolist() == [1, *hub.encode(digits + ">"), *hub.encode("".join(sorted(digits))), 2]
            assert start == 1 + len(hub.encode(digits + ">"))  # <bos>, the digits and '>': the whole prompt, no more
            assert (labels[:start] == -100).all() and torch.equal(labels[start:], ids[start:])
    lengths, char_lengths = splits["train"].lengths(), digits_sort["train"].lengths()
    assert (lengths <= char_lengths).all() and (lengths < char_lengths).any()  # "12" is one token
    assert 200 in torch.cat(splits["train"].input_ids).tolist()


def test_digit_tasks_leave_out_the_start_token_a_hub_tokenizer_lacks(fake_hub_tokenizer):
    hub, with_bos = fake_hub_tokenizer(bos_token_id=None), fake_hub_tokenizer()
    data = text.load_text_splits("digits_source", 8, 4, 4, seq_len=SEQ_LEN, tokenizer=hub)["train"]
    bos = text.load_text_splits("digits_source", 8, 4, 4, seq_len=SEQ_LEN, tokenizer=with_bos)["train"]
    for i in range(8):
        ids, start = data.input_ids[i], data.answer_start(i)
        assert torch.equal(bos.input_ids[i], torch.cat([torch.tensor([1]), ids])) and start == bos.answer_start(i) - 1
        assert ids[0] >= 100 and ids[-1] == 2 and hub.decode(ids[:start]).endswith(">")
        assert (data.labels[i][:start] == -100).all() and torch.equal(data.labels[i][start:], ids[start:])
        assert hub.decode(ids[start:]) == hub.decode(ids[:start - 1])[::-1]


def test_digit_tasks_in_a_hub_tokenizer_refuse_a_seq_len_below_their_longest_example(fake_hub_tokenizer):
    hub, longest = fake_hub_tokenizer(), 26  # these 16 examples' longest: 27 characters, one "12" among them
    with_chars = text.load_text_splits("digits_sort", 8, 4, 4, seq_len=64)
    assert max(int(d.lengths().max()) for d in with_chars.values()) == longest + 1 == text.tasks.DIGITS_LONGEST
    fits = text.load_text_splits("digits_sort", 8, 4, 4, seq_len=longest, tokenizer=hub)
    assert int(max(d.lengths().max() for d in fits.values())) == longest == fits["train"].seq_len
    with pytest.raises(ConfigError, match=rf"seq_len={longest - 1} is not allowed: at least {longest} for digits_sort "
                                          rf"tokenized by 'fake/digits' \(its longest example has {longest} tokens\)"
                                          r"; it is never truncated"):
        text.load_text_splits("digits_sort", 8, 4, 4, seq_len=longest - 1, tokenizer=hub)


def test_splits_are_deterministic_disjoint_and_keep_test_when_train_grows(digits_sort):
    again = text.load_text_splits("digits_sort", 256, 64, 64, seq_len=SEQ_LEN, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(digits_sort["train"].input_ids, again["train"].input_ids, strict=True))
    as_sets = {s: {tuple(x.tolist()) for x in d.input_ids} for s, d in digits_sort.items()}
    assert [len(as_sets[s]) for s in text.tasks.SPLITS] == [256, 64, 64]
    assert not (as_sets["train"] & as_sets["test"]) and not (as_sets["val"] & as_sets["test"])
    bigger = text.load_text_splits("digits_sort", 512, 64, 64, seq_len=SEQ_LEN, seed=0)
    assert {tuple(x.tolist()) for x in bigger["test"].input_ids} == as_sets["test"]
    other_seed = text.load_text_splits("digits_sort", 256, 64, 64, seq_len=SEQ_LEN, seed=1)
    assert {tuple(x.tolist()) for x in other_seed["test"].input_ids} != as_sets["test"]


def test_pydoc_text_is_truncated_to_seq_len_and_counts_it():
    train = text.load_text_splits("pydoc_text", 300, 50, 50, seq_len=64, seed=0)["train"]
    whole = text.load_text_splits("pydoc_text", 300, 50, 50, seq_len=100_000, seed=0)["train"]
    assert whole.num_truncated == 0 and int(whole.lengths().max()) > 64 and int(whole.lengths().min()) < 16
    assert train.num_truncated == int((whole.lengths() > 64).sum()) > 0
    assert all(torch.equal(cut, full[:64]) for cut, full in zip(train.input_ids, whole.input_ids, strict=True))
    pairs = zip(train.input_ids, train.labels, strict=True)
    assert all(lab[0] == -100 and torch.equal(lab[1:], ids[1:]) for ids, lab in pairs)
    assert train.tokenizer.name == "pydoc_bpe" and train[0]["input_ids"][0] == text.BOS_ID


def test_bad_dataset_arguments_name_the_field_and_what_is_allowed():
    with pytest.raises(ConfigError, match=r"dataset='digits' is not allowed: one of \['digits_source', 'digits_sort'"):
        text.load_text_splits("digits", 8, 8, 8, seq_len=32)
    with pytest.raises(ConfigError, match=r"seq_len=20 is not allowed: at least 27 for digits_sort .*never truncated"):
        text.load_text_splits("digits_sort", 8, 8, 8, seq_len=20)
    with pytest.raises(ConfigError, match=r"val_size=0 is not allowed: a positive integer"):
        text.load_text_splits("digits_sort", 8, 0, 8, seq_len=32)
    with pytest.raises(ConfigError, match=r"train_size=5000 is not allowed: at most \d+ for pydoc_text with val_size"):
        text.load_text_splits("pydoc_text", 5000, 8, 8, seq_len=32)


def test_exact_match_needs_every_answer_token_right():
    labels = torch.tensor([[-100, -100, 5, 6, 2], [-100, -100, 7, 8, 2], [-100, -100, 7, 2, -100]])
    predicted = torch.tensor([[0, 5, 6, 2, 9], [0, 7, 9, 2, 9], [3, 7, 2, 4, 4]])  # position t guesses token t + 1
    assert text.exact_match(predicted, labels).tolist() == [True, False, True]
    with pytest.raises(ConfigError, match=r"predicted_ids=\(3, 4\) is not allowed: the labels' shape \(3, 5\)"):
        text.exact_match(predicted[:, :4], labels)


# --- batching -------------------------------------------------------------------------------------


def test_pad_pads_to_the_longest_and_pad_max_to_seq_len():
    pad = text.collate(_examples(3, 5, 2), packing="pad")
    assert pad.input_ids.shape == (3, 5) and pad.input_ids[2].tolist() == [18, 19, 0, 0, 0]
    assert pad.labels[2].tolist() == [-100, 19, -100, -100, -100]
    assert pad.attention_mask.sum(dim=1).tolist() == [3, 5, 2]
    assert pad.counts() == text.TokenCounts(tokens=15, real_tokens=10, label_tokens=7)
    assert pad.pad_fraction == pytest.approx(5 / 15)
    pad_max = text.collate(_examples(3, 5, 2), packing="pad_max", seq_len=8)
    assert pad_max.input_ids.shape == (3, 8) and pad_max.pad_fraction == pytest.approx(14 / 24)
    assert set(pad_max.model_inputs()) == {"input_ids", "labels", "attention_mask", "use_cache"}


def test_pack_restarts_positions_at_each_document_and_never_splits_one():
    batch = text.collate(_examples(3, 5, 2), packing="pack", seq_len=8)
    assert batch.input_ids.shape == (2, 8)
    assert batch.input_ids[0].tolist() == list(range(10, 18)) and batch.input_ids[1, :2].tolist() == [18, 19]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 0, 1, 2, 3, 4, 5]]
    assert batch.document_ids.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, -1, -1, -1, -1, -1, -1]]
    assert batch.labels[0].tolist() == [-100, 11, 12, -100, 14, 15, 16, 17]  # no document predicts the next one
    assert batch.counts() == text.TokenCounts(tokens=16, real_tokens=10, label_tokens=7)
    assert batch.pad_fraction == pytest.approx(6 / 16)
    inputs = batch.model_inputs()
    assert "attention_mask" not in inputs and inputs["use_cache"] is False
    assert inputs["position_ids"] is batch.position_ids


def test_block_causal_mask_keeps_packed_documents_apart():
    mask = text.collate(_examples(2, 2), packing="pack", seq_len=5).block_causal_mask()
    assert mask.shape == (1, 1, 5, 5)
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                                         [0, 0, 0, 0, 1]]


def test_pack_rows_and_token_counts_add_up():
    assert text.pack_rows([3, 4, 2, 5, 8], seq_len=8) == [[0, 1], [2, 3], [4]]
    total = sum((text.TokenCounts(10, 6, 4), text.TokenCounts(10, 10, 9)), text.TokenCounts())
    assert total == text.TokenCounts(20, 16, 13) and total.pad_fraction == pytest.approx(0.2)
    assert text.TokenCounts().pad_fraction == 0.0


def test_bad_batching_arguments_are_refused():
    with pytest.raises(ConfigError, match=r"packing='padded' is not allowed: one of \['pad', 'pad_max', 'pack'\]"):
        text.collate(_examples(3), packing="padded")
    with pytest.raises(ConfigError, match=r"seq_len=4 is not allowed: at least 5, the longest example here"):
        text.collate(_examples(3, 5), packing="pack", seq_len=4)
    with pytest.raises(ConfigError, match=r"seq_len=None is not allowed: a positive integer: packing='pad_max'"):
        text.collate(_examples(3), packing="pad_max")
    with pytest.raises(ConfigError, match=r"batch_size=0 is not allowed: a positive integer \(rows per batch\)"):
        text.make_token_loader(text.load_text_splits("digits_sort", 4, 1, 1, seq_len=SEQ_LEN)["train"], 0)


@pytest.mark.parametrize("packing", text.PACKINGS)
def test_a_loader_pass_gives_every_example_once_in_a_seeded_order(digits_sort, packing):
    train = digits_sort["train"]
    loader = text.make_token_loader(train, batch_size=16, packing=packing, seq_len=64, seed=3)
    batches = list(loader)
    assert len(batches) == len(loader) and all(b.input_ids.shape[0] <= 16 for b in batches)
    width = {"pad": int(train.lengths().max()), "pad_max": 64, "pack": 64}[packing]
    assert max(b.input_ids.shape[1] for b in batches) == width
    counts = sum((b.counts() for b in batches), text.TokenCounts())
    assert counts.real_tokens == int(train.lengths().sum())
    assert counts.label_tokens == sum(int((lab != -100).sum()) for lab in train.labels)
    assert sum(int(b.document_ids.amax(dim=1).add(1).sum()) for b in batches) == len(train)
    again = list(text.make_token_loader(train, batch_size=16, packing=packing, seq_len=64, seed=3))
    assert torch.equal(again[0].input_ids, batches[0].input_ids)
    assert not torch.equal(list(loader)[0].input_ids, batches[0].input_ids)  # a new order on the next pass
