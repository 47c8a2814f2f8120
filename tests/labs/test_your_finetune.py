"""Notebook 11 (`labkit.labs.your_finetune`): the offline workload, its planted fault, the form, the exercises."""

import json

import pytest

import labkit
from labkit.env import PROFILES
from labkit.exercises import WrongAnswer
from labkit.finetune import Finetune
from labkit.labs import your_finetune as lab
from labkit.labs.your_finetune import exercises

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LABKIT_DATA_DIR", str(tmp_path_factory.mktemp("data")))
        patch.setenv("LABKIT_OFFLINE", "1")
        yield lab.workload(labkit.profile("ci"))


def test_the_data_comes_in_both_shapes_seeded_and_the_same_each_time(tmp_path):
    first, again = lab.write_data(tmp_path / "a", 6), lab.write_data(tmp_path / "b", 6)
    assert list(first) == ["prompt/completion", "messages", "seeded fault"]
    rows = {shape: [json.loads(line) for line in open(path)] for shape, path in first.items()}
    assert set(rows["prompt/completion"][0]) == {"prompt", "completion"} and set(rows["messages"][0]) == {"messages"}
    assert len(rows["seeded fault"][0]["prompt"].split()) >= lab.SEQ_LEN  # longer than seq_len in any tokenizer
    assert [open(p).read() for p in first.values()] == [open(p).read() for p in again.values()]


def test_ci_builds_a_small_qwen_offline_with_a_subset_of_rungs(workload):
    mine = Finetune(workload.model, data=workload.data, gpu=workload.gpu)
    assert mine.config.model_type == "qwen2" and mine.config.tie_word_embeddings  # the architecture kept
    assert mine.shape.num_hidden_layers == 2 and workload.rungs == lab.RUNGS["ci"] and 0 < workload.train_steps <= 16
    assert lab.workload(PROFILES["full"]).model == lab.HUB_MODEL  # the hub model at full


def test_the_audit_finds_the_planted_fault_and_only_there(workload):
    audits = {shape: Finetune(workload.model, data=path, seq_len=lab.SEQ_LEN, gpu="t4").audit(packing=False)
              for shape, path in workload.shapes.items()}
    assert set(audits["seeded fault"].faults) == {"truncated", "supervised"}
    assert not audits["prompt/completion"].faults and not audits["messages"].faults
    assert audits["messages"].warnings == ["chat template"]  # a template without generation marks


def test_the_form_replans_on_a_slider_and_names_a_bad_field(workload):
    widgets = pytest.importorskip("labkit.widgets")
    form = widgets.FinetuneForm(workload.model, workload.data, gpu="t4", seq_len=128)
    assert type(form.last_result).__name__ == "Plan" and set(form.last_result.frame.method) == {"full", "LoRA", "QLoRA"}
    form.controls["method"].value = "QLoRA"
    assert set(form.last_result.frame.method) == {"QLoRA"} and form.last_error is None
    form.fields["gpu"].value = "h100"
    assert "gpu='h100'" in str(form.last_error) and "ConfigError" in form.status.value


def test_the_exercises_accept_the_solutions_and_refuse_a_wrong_answer():
    assert "correct" in exercises.check("11.pad_share", exercises.pad_share_solution)
    with pytest.raises(WrongAnswer, match="pad each batch to ITS longest"):
        exercises.check("11.pad_share", lambda lengths, batch: 1 - sum(lengths) / (max(lengths) * len(lengths)))
    mine = {"tokens_per_s": 1000.0, "real_tokens_per_s": 750.0}
    assert "correct" in exercises.check("11.own_padding", 0.25, mine)
    with pytest.raises(WrongAnswer):
        exercises.check("11.own_padding", 0.75, mine)
    assert "not attempted" in exercises.check("11.own_padding", None, mine)
