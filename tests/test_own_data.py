"""A learner's own text data: each shape read, the loss where it belongs, and every bad input named."""

import json

import pytest
import torch
from own_fixtures import chats, model_dir, prompt_completion, write_jsonl

from labkit.errors import ConfigError, DatasetUnavailableError
from labkit.models.own import own_tokenizer
from labkit.text import IGNORE_INDEX
from labkit.text.own_data import load_own_splits
from labkit.text.records import parse_hf, read_records


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {t: model_dir(root, template=t) for t in ("marked", "plain", "none")}


@pytest.fixture(scope="module")
def tokenizers(folders):
    return {t: own_tokenizer(path)[0] for t, path in folders.items()}


def trained_text(tok, ids, labels) -> str:
    return tok.decode([i for i, label in zip(ids.tolist(), labels.tolist(), strict=True) if label != IGNORE_INDEX],
                      skip_special_tokens=False)


def test_prompt_completion_trains_the_completion_and_its_eos_even_where_pad_is_eos(tmp_path, tokenizers):
    tok = tokenizers["marked"]
    assert tok.backend.pad_token_id == tok.eos_id  # as in Qwen2.5's tokenizer
    splits = load_own_splits(write_jsonl(tmp_path / "pc.jsonl", prompt_completion()), tok, seq_len=64)
    report = splits["train"].report
    assert (report.shape, report.loss_on, report.records, report.split_sizes) == ("prompt_completion", "completion",
                                                                                 24, (20, 2, 2))
    for ids, labels in zip(splits["train"].input_ids, splits["train"].labels, strict=True):
        whole = tok.decode(ids, skip_special_tokens=False)
        answer = whole[whole.index("It is"):]
        assert trained_text(tok, ids, labels) == answer and answer.endswith("<|endoftext|>")
    assert 0 < report.supervised_share < 0.6


def test_the_assistant_turns_are_the_same_from_generation_marks_and_from_labkits_own_span_finding(tmp_path,
                                                                                                 tokenizers):
    path = write_jsonl(tmp_path / "chat.jsonl", chats())
    marked = load_own_splits(path, tokenizers["marked"], seq_len=128)["train"]
    found = load_own_splits(path, tokenizers["plain"], seq_len=128)["train"]
    assert "marks" in marked.report.template and "found by labkit" in found.report.template
    for a, b in zip(marked.labels, found.labels, strict=True):
        # the marked template trains "content<|im_end|>" of each assistant turn; the span finding also the newline
        # after it, which belongs to the turn as the template renders it
        assert set((a != IGNORE_INDEX).nonzero().flatten().tolist()) <= set((b != IGNORE_INDEX).nonzero().flatten()
                                                                          .tolist())
    text = trained_text(tokenizers["plain"], found.input_ids[0], found.labels[0])
    assert text.count("<|im_end|>") == 2 and "Answer in one word" not in text and "Name the number" not in text


def test_no_template_renders_chatml_and_says_so(tmp_path, tokenizers, capsys):
    splits = load_own_splits(write_jsonl(tmp_path / "chat.jsonl", chats()), tokenizers["none"], seq_len=128)
    assert "ChatML rendered by labkit" in splits["train"].report.template
    assert "ChatML" in capsys.readouterr().out


@pytest.mark.parametrize(("records", "shape", "trained"), [
    ([{"text": f"Line {i} of a document."} for i in range(10)], "text", "of a document."),  # not the first token
    ([{"instruction": "Double it.", "input": str(i), "output": str(2 * i)} for i in range(10)], "alpaca", None),
    ([{"conversations": [{"from": "human", "value": f"Hi {i}"}, {"from": "gpt", "value": "Hello"}]}
      for i in range(10)], "sharegpt", "Hello"),
])
def test_each_shape_is_detected_from_its_columns(tmp_path, tokenizers, records, shape, trained):
    splits = load_own_splits(write_jsonl(tmp_path / "d.jsonl", records), tokenizers["marked"], seq_len=96)
    assert splits["train"].report.shape == shape
    if trained is not None:
        assert trained in trained_text(tokenizers["marked"], splits["train"].input_ids[0], splits["train"].labels[0])


def test_alpaca_trains_the_output_only(tmp_path, tokenizers):
    records = [{"instruction": "Double it.", "input": str(i), "output": f"{2 * i}!"} for i in range(10)]
    split = load_own_splits(write_jsonl(tmp_path / "a.jsonl", records), tokenizers["marked"], seq_len=96)["train"]
    text = trained_text(tokenizers["marked"], split.input_ids[0], split.labels[0])
    assert text.endswith("!<|endoftext|>") and "Instruction" not in text


def test_csv_parquet_a_column_mapping_and_objects_passed_in(tmp_path, tokenizers):
    import datasets

    rows = [{"question": f"q{i}?", "answer": f"a{i}."} for i in range(12)]
    table = datasets.Dataset.from_list(rows)
    table.to_csv(str(tmp_path / "qa.csv"))
    table.to_parquet(str(tmp_path / "qa.parquet"))
    mapping = {"prompt": "question", "completion": "answer"}
    for spec in (str(tmp_path / "qa.csv"), str(tmp_path / "qa.parquet"), table, rows):
        split = load_own_splits(spec, tokenizers["marked"], seq_len=32, columns=mapping)["train"]
        assert split.report.shape == "prompt_completion" and len(split) == 10
    strings = load_own_splits([f"text {i}" for i in range(10)], tokenizers["marked"], seq_len=32)["train"]

    class Records(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"text": f"text {i}"}

    assert strings.report.shape == "text" and load_own_splits(Records(), tokenizers["marked"], 32)["train"].report


def test_truncation_and_examples_left_untrained_are_counted(tmp_path, tokenizers, capsys):
    records = [{"prompt": "word " * (40 if i % 4 == 0 else 2), "completion": "done."} for i in range(20)]
    report = load_own_splits(write_jsonl(tmp_path / "long.jsonl", records), tokenizers["marked"], 24)["train"].report
    assert report.truncated == 5 and report.dropped == 5 and sum(report.split_sizes) == 15
    assert "5 of 20 examples are longer than seq_len=24" in " ".join(capsys.readouterr().out.split())


def test_hf_ids_parse_and_need_the_network():
    assert parse_hf("hf:tatsu-lab/alpaca") == ("tatsu-lab/alpaca", None, None)
    assert parse_hf("hf:openai/gsm8k/main@test") == ("openai/gsm8k", "main", "test")
    with pytest.raises(ConfigError, match=r"dataset='hf:alpaca' is not allowed: hf:ORG/NAME"):
        parse_hf("hf:alpaca")
    with pytest.raises(DatasetUnavailableError, match="offline"):
        read_records("hf:tatsu-lab/alpaca", online=False)


@pytest.mark.parametrize(("content", "match"), [
    (None, r"dataset='.*missing.jsonl' is not allowed: an existing .* no such file"),
    (b"", r"a file with at least one record. this one is empty"),
    (b'{"text": "caf\xe9"}\n', r"UTF-8 text. byte 13 \(line 1\) is not UTF-8"),
    (b'{"text": "a"}\n{"text": "b"\n', r"bad.jsonl:2' is not allowed: one JSON object per line .*line 2 is not valid"),
    (b'{"prompt": "a", "completion": "b"}\n{"prompt": "c"}\n',
     r"bad.jsonl line 2 field 'completion'='missing' is not allowed: text"),
    (b'{"question": "a", "answer": "b"}\n', r"the columns found are \['answer', 'question'\]; map yours with "
                                            r"data_columns"),
    (b'{"prompt": "a", "completion": 3}\n', r"field 'completion'='int 3' is not allowed: text"),
])
def test_bad_files_are_named_with_the_line_and_what_is_allowed(tmp_path, tokenizers, content, match):
    path = tmp_path / ("missing.jsonl" if content is None else "bad.jsonl")
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        load_own_splits(str(path), tokenizers["marked"], seq_len=32)


def test_a_parquet_column_that_is_not_text_is_named(tmp_path, tokenizers):
    import datasets

    datasets.Dataset.from_list([{"text": i} for i in range(5)]).to_parquet(str(tmp_path / "n.parquet"))
    with pytest.raises(ConfigError, match=r"n.parquet row 0 field 'text'='int 0' is not allowed: text"):
        load_own_splits(str(tmp_path / "n.parquet"), tokenizers["marked"], seq_len=32)


def test_every_label_masked_is_refused(tmp_path, tokenizers):
    records = [{"prompt": "word " * 40, "completion": "x"} for _ in range(5)]
    with pytest.raises(ConfigError, match=r"loss_on='completion' is not allowed: a loss on at least one token.*every "
                                          r"label is masked in all 5 records"):
        load_own_splits(write_jsonl(tmp_path / "masked.jsonl", records), tokenizers["marked"], seq_len=16)


def test_a_template_that_rewrites_earlier_turns_is_refused_for_the_assistant_loss(tmp_path, tokenizers):
    tok = tokenizers["plain"]
    # like the templates that drop earlier reasoning: the last assistant turn is rendered apart from the others
    tok.backend.chat_template = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
                                 "[earlier]{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                                 "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                                 "{% endif %}")
    try:
        with pytest.raises(ConfigError, match=r"loss_on='assistant' is not allowed: a chat template with "
                                              r"\{% generation %\} marks.*turn 5 differently"):
            load_own_splits(write_jsonl(tmp_path / "c.jsonl", chats()), tok, seq_len=128)
        assert load_own_splits(write_jsonl(tmp_path / "c2.jsonl", chats()), tok, 128, loss_on="all")["train"]
    finally:
        tok.backend.chat_template = json.loads(json.dumps(tokenizers["plain"].backend.chat_template))


def test_loss_on_must_fit_the_shape(tmp_path, tokenizers):
    with pytest.raises(ConfigError, match=r"loss_on='assistant' is not allowed: None or one of \['completion', "
                                          r"'all'\] for prompt_completion records"):
        load_own_splits(write_jsonl(tmp_path / "pc.jsonl", prompt_completion()), tokenizers["marked"], 64,
                        loss_on="assistant")
