"""Your fine-tune (labkit.finetune): the target, the plan from a config alone, the audit's seeded faults, the
measured peak against the predicted one on two model shapes and two data shapes, the recommendation, the CLI."""

import json
import time

import pandas as pd
import pytest
import torch
from own_fixtures import chats, model_dir, prompt_completion, write_jsonl

from labkit import cli
from labkit.errors import ConfigError
from labkit.finetune import (
    Finetune,
    Plan,
    audit_examples,
    measure_methods,
    measure_ranks,
    packing_leak,
    parse_target,
    recommend_from,
)
from labkit.finetune.measure import ERROR_BOUND, UNDER_BOUND
from labkit.labresult import LabResult
from labkit.machine import T4_TORCH_BYTES
from labkit.text import IGNORE_INDEX

WIDE = {"hidden_size": 128, "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 3, "head_dim": 32}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("finetune")


@pytest.fixture(scope="module")
def long_data(folder):
    records = [{"prompt": "word " * (10 + 7 * i) + "? ", "completion": "answer " * (20 + 5 * i)} for i in range(24)]
    return write_jsonl(folder / "long.jsonl", records)


def test_targets_name_their_memory_and_refuse_what_is_not_one():
    assert parse_target("t4").memory_bytes == T4_TORCH_BYTES and parse_target("t4").precision == "fp16"
    assert parse_target("kaggle-2xt4").gpus == 2
    assert parse_target("24GiB").memory_bytes == 24 * 2**30 and parse_target("16 GB").memory_bytes == 16e9
    for bad in ("3TB", "-1GiB", "h100", 0):
        with pytest.raises(ConfigError, match=r"gpu=.*is not allowed.*t4"):
            parse_target(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="this machine has no GPU"):
            parse_target("this")


def test_a_7b_plan_comes_from_its_config_alone_in_seconds(folder, monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    data = write_jsonl(folder / "chats.jsonl", chats(40))
    start = time.perf_counter()
    plan = Finetune("Qwen/Qwen2.5-7B", data=data, gpu="t4", batch_size=4).plan()
    assert time.perf_counter() - start < 30
    rows = plan.frame
    assert (rows[rows["method"] == "full"]["fits"] == "no").all()
    assert (rows[rows["method"] == "QLoRA"]["fits"] != "no").all()
    assert rows["total_bytes"].min() > 4 * 2**30  # 7.6B weights in NF4 alone are over 4 GiB
    assert "QLoRA" in plan.finding()
    nothing = Finetune("Qwen/Qwen2.5-7B", data=data, gpu="2GiB").plan()
    assert "NO plan fits" in nothing.finding() and "smallest" in nothing.finding()
    refused = Finetune("Qwen/Qwen2.5-7B", data=data, gpu="2GiB").recommend()
    assert refused.frame.iloc[0]["value"] == "none"
    with pytest.raises(ConfigError, match="a plan that fits"):
        refused.run_config()


def test_bad_fields_are_named():
    with pytest.raises(ConfigError, match="model='nope'"):
        Finetune("nope", data="x.jsonl")
    with pytest.raises(ConfigError, match="data='x.txt'"):
        Finetune("Qwen/Qwen2.5-7B", data="x.txt")
    with pytest.raises(ConfigError, match="batch_size=0"):
        Finetune("Qwen/Qwen2.5-7B", data="x.jsonl", batch_size=0, gpu="t4")


class _Tok:
    eos_id, pad_id, backend = 2, 0, None

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def _examples(count=20, length=12):
    return [([1, *range(5, 5 + length), 2], [IGNORE_INDEX, *[IGNORE_INDEX] * (length // 2),
                                               *range(5 + length // 2, 5 + length), 2]) for _ in range(count)]


def test_the_audit_catches_each_seeded_fault():
    clean = audit_examples(_examples(), _Tok(), seq_len=64, batch_size=4, loss_on="completion")
    assert clean.faults == [] and "[[" in clean.example
    masked = [(ids, [IGNORE_INDEX] * len(ids)) for ids, _ in _examples()]
    assert "supervised" in audit_examples(masked, _Tok(), 64, 4, "completion").faults
    no_eos = [(ids, [*labels[:-1], IGNORE_INDEX]) for ids, labels in _examples()]  # a pad-masking collator, pad == EOS
    assert "EOS trained" in audit_examples(no_eos, _Tok(), 64, 4, "completion").faults
    assert "truncated" in audit_examples(_examples(), _Tok(), seq_len=8, batch_size=4, loss_on="completion").faults


def test_a_template_without_generation_marks_is_flagged_and_packing_stays_apart(folder):
    data = write_jsonl(folder / "turns.jsonl", chats(12))
    audit = Finetune(model_dir(folder, "meta-llama/Llama-3.2-1B", "plain"), data=data, gpu="t4").audit()
    assert "chat template" in audit.warnings and audit.faults == []
    assert float(audit.frame.set_index("check").loc["packing leak", "value"]) < 1e-4


def test_a_model_that_ignores_position_ids_leaks_across_packed_documents(folder):
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=write_jsonl(folder / "pc.jsonl",
                                                                           prompt_completion(8)), gpu="t4")
    inner = mine.leak_model().eval()

    class Unpacked(torch.nn.Module):  # an older library: one causal mask over the whole packed row
        training = False

        def forward(self, input_ids, **kwargs):
            return inner(input_ids=input_ids, use_cache=False)

    examples = mine.encoded.examples[:3]
    assert packing_leak(Unpacked(), examples, 256) > 1e-3
    assert packing_leak(inner, examples, 256) < 1e-4


@pytest.mark.parametrize("repo", ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B"])  # tied + GQA + biases; Llama 3
@pytest.mark.parametrize("shape", ["prompt_completion", "messages"])
def test_the_predicted_peak_holds_its_stated_error(folder, long_data, repo, shape):
    data = long_data if shape == "prompt_completion" else write_jsonl(folder / "chats.jsonl", chats(24))
    mine = Finetune(model_dir(folder, repo, **WIDE), data=data, gpu="t4", seq_len=256, batch_size=4)
    rows = mine.measure().frame
    assert rows["error"].notna().all(), rows
    assert (rows["error"].abs() <= ERROR_BOUND).all() and (rows["error"] >= -UNDER_BOUND).all(), rows


def test_the_recommendation_builds_the_libraries_objects(folder, long_data):
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=long_data, gpu="t4", batch_size=4)
    rec = mine.recommend()
    assert rec.run_config().seq_len == rec.sft["max_length"] and "seq_len:" in rec.yaml()
    assert "because" in rec.frame and rec.frame["because"].str.len().min() > 5
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    qlora = Finetune("Qwen/Qwen2.5-7B", data=long_data, gpu="t4", batch_size=4).recommend()
    assert peft.LoraConfig(**qlora.lora).r == 16
    assert transformers.BitsAndBytesConfig(**qlora.bnb).load_in_4bit
    trl = pytest.importorskip("trl")
    assert trl.SFTConfig(output_dir="out", **rec.sft).max_length == rec.sft["max_length"]


def test_the_cli_plans_as_json_and_audits_with_an_exit_code(folder, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    data = write_jsonl(folder / "cli.jsonl", chats(12))
    assert cli.main(["plan", "Qwen/Qwen2.5-7B", "--data", data, "--gpu", "t4"]) == 0
    assert "QLoRA" in capsys.readouterr().out
    assert cli.main(["plan", "Qwen/Qwen2.5-7B", "--data", data, "--gpu", "t4", "--json", "--method", "qlora"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed[printed.index("{"):])
    assert {row["method"] for row in report["rows"]} == {"QLoRA"} and "T4" in report["finding"]
    assert cli.main(["audit", model_dir(folder, "Qwen/Qwen2.5-0.5B"), "--data", data, "--seq-len", "16"]) == 1
    assert "truncated" in capsys.readouterr().out
    assert cli.main(["plan", "Qwen/Qwen2.5-7B", "--data", data, "--gpu", "3TB"]) == 2
    assert "gpu='3TB'" in capsys.readouterr().err
    asked = []  # on two GPUs, measure checks the plan's per-GPU rows on two processes (run in the test below)
    stub = LabResult(pd.DataFrame({"method": ["full"]}))
    monkeypatch.setattr(Finetune, "measure_ranks", lambda self, methods: asked.append(methods) or stub)
    assert cli.main(["measure", "Qwen/Qwen2.5-7B", "--data", data, "--gpu", "kaggle-2xt4"]) == 0
    assert asked == [("full", "lora")]
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=data, gpu="kaggle-2xt4")
    with pytest.raises(ConfigError, match=r"method='qlora' is not allowed: 'full' or 'lora' \(QLoRA's 4-bit base"):
        measure_ranks(mine.run_config(), mine.shape, ("lora", "qlora"))  # refused before the first job starts


def test_qlora_is_measured_through_the_loop_within_the_stated_error(folder, long_data):
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B", **{**WIDE, "intermediate_size": 384}), data=long_data,
                    gpu="t4", seq_len=256, batch_size=4)
    row = mine.measure(methods=("qlora",)).frame.iloc[0]
    assert row["method"] == "QLoRA" and row["precision"] in ("bf16", "fp16"), row
    assert -UNDER_BOUND <= row["error"] <= ERROR_BOUND, row


def test_the_ladder_compares_each_rung_with_the_one_below(folder):
    data = write_jsonl(folder / "short.jsonl", prompt_completion(24))
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=data, gpu="t4", seq_len=128, batch_size=4)
    ladder = mine.ladder(rungs=("+SDPA", "+per-layer checkpointing", "LoRA"))
    rows = ladder.frame.set_index("rung")
    assert list(rows.index) == ["baseline", "+SDPA", "+per-layer checkpointing", "LoRA"]
    assert rows.loc["+per-layer checkpointing", "memory_change"] < 1  # checkpointing keeps less
    assert rows["time_change"].iloc[1:].str.contains("x").all()
    assert "torchtune" in rows.loc["+per-layer checkpointing", "published"]
    assert "baseline" in ladder.finding()
    with pytest.raises(ConfigError, match="rungs="):
        mine.ladder(rungs=("+warp drive",))


def test_the_recommended_run_trains_and_saves_its_adapter(folder, tmp_path):
    data = write_jsonl(folder / "short.jsonl", prompt_completion(24))
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=data, gpu="t4", seq_len=128, batch_size=4)
    plan = mine.plan()
    assert (plan.frame["fits"] == "yes").all()  # a tiny model fits a T4 every way
    result = mine.train(out_dir=tmp_path / "full", max_steps=6)
    assert result.steps == 6 and (tmp_path / "full" / "model.pt").is_file()
    adapters = Plan(plan.frame[plan.frame["method"] != "full"].reset_index(drop=True), target=plan.target)
    lora = recommend_from(adapters, mine.model, mine.data, "completion", 4)
    assert lora.config["lora_rank"] == 16 and lora.bnb is None
    mine.train(lora, out_dir=tmp_path / "lora", max_steps=6)
    saved = torch.load(tmp_path / "lora" / "adapter.pt")
    assert saved and all("lora" in name for name in saved)
    assert json.loads((tmp_path / "lora" / "adapter_config.json").read_text())["r"] == 16


def test_the_largest_batch_is_measured_and_halved_until_it_fits(folder):
    data = write_jsonl(folder / "short.jsonl", prompt_completion(24))
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=data, gpu="8MiB", seq_len=128, batch_size=4)
    rows = mine.largest_batch(margin=0.1).frame
    assert rows["peak_memory_bytes"].iloc[-1] <= 0.9 * 8 * 2**20 < rows["peak_memory_bytes"].iloc[:-1].min() \
        if len(rows) > 1 else rows["peak_memory_bytes"].iloc[-1] <= 0.9 * 8 * 2**20
    assert list(rows["batch"]) == sorted(rows["batch"], reverse=True)
    with pytest.raises(ConfigError, match="margin=1.5"):
        mine.largest_batch(margin=1.5)


def test_the_recommendation_cites_the_measured_row(folder):
    data = write_jsonl(folder / "short.jsonl", prompt_completion(24))
    mine = Finetune(model_dir(folder, "Qwen/Qwen2.5-0.5B"), data=data, gpu="t4", seq_len=128, batch_size=4)
    assert "measured here" not in mine.recommend().frame.iloc[0]["because"]
    mine.measure(methods=("full",))
    assert "measured here at batch 4" in mine.recommend().frame.iloc[0]["because"]


def test_bf16_checkpointed_lora_holds_the_stated_error(folder, long_data):
    # labkit's LoRA under autocast: a float32 base and float32 adapters, whose input's gradient comes back in float32
    mine = Finetune(model_dir(folder, "meta-llama/Llama-3.2-1B", **WIDE), data=long_data, gpu="t4", seq_len=256,
                    batch_size=4)
    cfg = mine.run_config().replace(precision="bf16", checkpointing=True)
    row = measure_methods(cfg, mine.shape, ("lora",)).frame.iloc[0]
    assert -UNDER_BOUND <= row["error"] <= ERROR_BOUND, row


def test_the_two_gpu_plan_is_checked_on_two_processes(tmp_path, long_data):
    # seq_len 512 cuts no example, so every rank's batch has padding, as the formula assumes (masked=True): a rank
    # whose rows were all cut to seq_len would hold no padding mask and measure less
    mine = Finetune(model_dir(tmp_path, **WIDE), data=long_data, gpu="kaggle-2xt4", seq_len=512, batch_size=2)
    plan = mine.plan()
    rows = plan.frame
    assert set(zip(rows["method"], rows["strategy"], strict=True)) == {
        ("full", "DDP"), ("full", "FSDP2"), ("LoRA", "DDP"), ("LoRA", "FSDP2"), ("QLoRA", "DDP")}
    by = rows.groupby(["method", "strategy"]).first()
    assert by.loc[("full", "FSDP2"), "total_bytes"] < by.loc[("full", "DDP"), "total_bytes"]
    assert by.loc[("LoRA", "FSDP2"), "communication_bytes"] > 5 * by.loc[("LoRA", "DDP"), "communication_bytes"]
    assert "FSDP2 cannot shard 4-bit weights" in plan.finding() and "strategy" in plan.show_columns()
    # full fine-tuning only here, to keep CI's time: LoRA's two rows measured +0.6 % and +0.8 % by hand (issue 43)
    measured = mine.measure_ranks(("full",)).frame
    assert list(zip(measured["method"], measured["strategy"], strict=True)) == [("full", "DDP"), ("full", "FSDP2")]
    assert (measured["error"].abs() <= ERROR_BOUND).all() and (measured["error"] >= -UNDER_BOUND).all(), measured.T
    ddp = measured[measured["strategy"] == "DDP"]
    assert (ddp["sent_bytes"] == ddp["planned_sent_bytes"]).all()  # DDP's all-reduce: exactly the plan's bytes
    fsdp, whole = measured.iloc[1], measured.iloc[0]
    assert fsdp["peak_memory_bytes"] < whole["peak_memory_bytes"]
