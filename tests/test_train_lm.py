"""Language models through `labkit.fit` on the CPU: tiny_llama on digits_sort, padded and packed, token-normalised
gradient accumulation (the issue-28 bug), packing against padding, sweeps and the CLI (random weights, offline)."""

import json

import pytest
import torch
import torch.nn.functional as F

import labkit
from labkit import cli, models, text
from labkit.kinds import language as train_lm
from labkit.techniques.token_loss import forward_inputs, micro_batch_loss, split_rows, token_loss_sum
from labkit.train import Trainer

pytest.importorskip("transformers")


@pytest.fixture
def lm_cfg():
    return labkit.RunConfig(model="tiny_llama", dataset="digits_sort", batch_size=8, max_steps=5, train_size=64,
                            pretrained=False, device="cpu")


def test_fit_reports_tokens_per_second_and_padding(lm_cfg):
    padded = labkit.fit(lm_cfg, progress=False)
    packed = labkit.fit(lm_cfg.replace(packing="pack", seq_len=64), progress=False)
    for res in (padded, packed):
        assert res.tokens_per_s > res.real_tokens_per_s > 0
        assert res.throughput > 0 and res.flops_per_step > 0 and res.peak_memory_bytes > 0
        assert res.memory["optimizer_state"] > 0 and res.memory["activations"] > 0
        assert 0 <= res.accuracy <= 1 and res.compile_time_s is None
        assert res.weights == "random" and res.losses[-1] < res.losses[0]
    assert 0 < packed.pad_fraction < padded.pad_fraction < 1
    assert labkit.RunResult.from_dict(padded.to_dict()).tokens_per_s == padded.tokens_per_s


def test_vision_results_have_no_token_figures(tiny_cfg):
    res = labkit.fit(tiny_cfg, progress=False)
    assert res.tokens_per_s is None and res.pad_fraction is None and res.accuracy is not None


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_grad_accum_gives_the_large_batch_gradient_with_uneven_token_counts(lm_cfg):
    whole = Trainer(lm_cfg.replace(grad_accum=1))
    accumulated = Trainer(lm_cfg.replace(grad_accum=4))
    examples = sorted((whole.train_split[i] for i in range(8)), key=lambda e: len(e["input_ids"]))
    batch = text.collate(examples)  # shortest first: each micro-batch of 2 rows holds more answer tokens than the last
    micro_batches = split_rows(batch, 4)
    label_tokens = [micro.counts().label_tokens for micro in micro_batches]
    assert len(set(label_tokens)) > 1, label_tokens  # uneven, where the old rule goes wrong
    whole.accumulate(batch)
    accumulated.accumulate(batch)
    expected, got = _grads(whole.model), _grads(accumulated.model)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert float((got - expected).norm() / expected.norm()) < 1e-5
    # The old loop's rule: each micro-batch's mean token loss / grad_accum.
    accumulated.model.zero_grad(set_to_none=True)
    for micro in micro_batches:
        logits = accumulated.model(**forward_inputs(micro)).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), micro.labels[:, 1:].flatten()) / 4
        loss.backward()
    old = _grads(accumulated.model)
    assert float((old - expected).norm() / expected.norm()) > 0.05


def test_packed_rows_give_the_padded_loss():
    model, _ = models.build_language_model("tiny_llama", vocab_size=16, pretrained=False)
    train = text.load_text_splits("digits_sort", 8, 1, 1, seq_len=32)["train"]
    examples = [train[i] for i in range(8)]
    padded, packed = text.collate(examples, packing="pad"), text.collate(examples, packing="pack", seq_len=128)
    assert packed.input_ids.shape[0] < padded.input_ids.shape[0]
    assert packed.counts().label_tokens == padded.counts().label_tokens
    with torch.no_grad():
        loss_padded = micro_batch_loss(model, padded, padded.counts().label_tokens)
        loss_packed = micro_batch_loss(model, packed, packed.counts().label_tokens)
        mean = float(model(**padded.model_inputs()).loss)  # transformers' own mean over the label tokens
    assert float(loss_packed) == pytest.approx(float(loss_padded), rel=1e-5)
    assert float(loss_padded) == pytest.approx(mean, rel=1e-5)


@pytest.fixture
def fresh_text_splits():
    """`train_lm.text_splits` caches splits per session: a faked tokenizer's must not outlive its test."""
    train_lm.text_splits.cache_clear()
    yield
    train_lm.text_splits.cache_clear()


def test_a_pretrained_hub_model_gets_digits_sort_in_its_own_tokens_and_its_weights(monkeypatch, fake_hub_tokenizer,
                                                                                   fresh_text_splits):
    transformers = pytest.importorskip("transformers")
    repo, calls = models.HUB_MODELS["smollm2_135m"].repo, []

    def hub_tokenizer(name):
        calls.append(("tokenizer", name))
        return fake_hub_tokenizer(name=repo), None

    def weights(repo, **kwargs):
        calls.append(("weights", repo))
        config = models.hub_config("smollm2_135m", kwargs["attn_implementation"], num_hidden_layers=1, vocab_size=256)
        return transformers.AutoModelForCausalLM.from_config(config)

    monkeypatch.setattr(models, "hub_tokenizer", hub_tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", weights)
    cfg = labkit.RunConfig(model="smollm2_135m", dataset="digits_sort", batch_size=2, max_steps=2, train_size=8)
    splits = labkit.train.run_splits(cfg)
    chars = labkit.train.run_splits(cfg.replace(pretrained=False))  # random weights: labkit's characters
    assert calls == [("tokenizer", "smollm2_135m")] and chars["train"].tokenizer.name == "chars"
    hub = splits["train"].tokenizer
    assert hub.name == repo and splits["train"].input_ids[0][0] == 1 and splits["train"].input_ids[0][1] >= 100
    for split in text.tasks.SPLITS:  # the same prompts, in other ids
        assert [hub.decode(ids) for ids in splits[split].input_ids] == \
            [chars[split].tokenizer.decode(ids) for ids in chars[split].input_ids]
    _, weights_info = models.build_language_model("smollm2_135m", hub.vocab_size, tokenizer=hub)
    assert weights_info.source == f"hub:{repo}" and weights_info.warning is None
    assert calls == [("tokenizer", "smollm2_135m"), ("weights", repo)]


def test_digits_sort_falls_back_to_the_characters_without_the_hub_tokenizer(monkeypatch, capsys, fresh_text_splits):
    cfg = labkit.RunConfig(model="smollm2_135m", dataset="digits_sort", batch_size=2, train_size=8)
    offline = labkit.train.run_splits(cfg)  # $LABKIT_OFFLINE=1: no download
    assert offline["train"].tokenizer.name == "chars" and capsys.readouterr().out == ""
    monkeypatch.setattr(models, "hub_tokenizer", lambda name: (None, "its tokenizer could not be downloaded"))
    monkeypatch.setattr(models, "is_online", lambda: True)
    train_lm.text_splits.cache_clear()  # the same arguments again
    failed = labkit.train.run_splits(cfg)
    assert failed["train"].tokenizer.name == "chars"
    assert all(torch.equal(a, b) for a, b in zip(failed["train"].input_ids, offline["train"].input_ids, strict=True))
    assert " ".join(capsys.readouterr().out.split()) == ("labkit note: digits_sort is tokenized by labkit's character "
                                                         "tokenizer: its tokenizer could not be downloaded")


def test_token_loss_sum_ignores_unlabelled_positions():
    logits = torch.randn(1, 4, 5)
    labels = torch.tensor([[-100, 3, -100, 1]])
    expected = F.cross_entropy(logits[0, [0, 2]], torch.tensor([3, 1]), reduction="sum")
    assert float(token_loss_sum(logits, labels)) == pytest.approx(float(expected))


@pytest.mark.parametrize("impl", ["forloop", "foreach", "fused"])
def test_optimizer_impl_trains(lm_cfg, impl):
    trainer = Trainer(lm_cfg.replace(optimizer_impl=impl))
    group = trainer.optimizer.param_groups[0]
    assert group["fused"] is (True if impl == "fused" else None)
    assert group["foreach"] is {"forloop": False, "foreach": True, "fused": None}[impl]
    before = float(trainer.step(next(iter(trainer.loader))))
    assert before > 0


def test_sweep_over_seq_len(lm_cfg):
    df = labkit.sweep(lm_cfg.replace(packing="pad_max", evaluate=False), seq_len=[32, 64], progress=False)
    assert list(df["seq_len"]) == [32, 64] and df["error"].isna().all()
    assert (df["throughput"] > 0).all() and (df["peak_memory_bytes"] > 0).all()


def test_flops_count_the_attention_the_cpu_sdpa_kernel_hides(lm_cfg):
    cfg = lm_cfg.replace(packing="pad_max", evaluate=False, max_steps=4)
    sdpa, eager = (labkit.fit(cfg.replace(attn_implementation=impl), progress=False) for impl in ("sdpa", "eager"))
    assert sdpa.flops_per_step == eager.flops_per_step  # eager's bmm products are counted by torch's counter
    attention = models.uncounted_attention_flops(sdpa.model, cfg.batch_size, 32, "cpu")
    assert 0 < attention < sdpa.flops_per_step


def test_cli_runs_a_language_model_yaml(tmp_path, capsys):
    path = tmp_path / "lm.yaml"
    path.write_text("model: tiny_llama\ndataset: digits_sort\nbatch_size: 8\nmax_steps: 4\ntrain_size: 32\n"
                    "pretrained: false\npacking: pack\nseq_len: 64\noptimizer_impl: fused\nevaluate: false\n")
    assert cli.main(["run", str(path)]) == 0
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["config"]["packing"] == "pack" and payload["tokens_per_s"] > payload["real_tokens_per_s"] > 0


class _OnDevice(torch.Tensor):
    """A tensor that stands for one on a GPU: reading a number out of it (a device-to-host copy) raises."""

    def __int__(self):
        raise AssertionError("a number was read back from the device inside the step (a GPU sync)")

    __float__ = __bool__ = item = __int__


def test_the_step_counts_its_label_tokens_before_the_batch_moves(lm_cfg, monkeypatch):
    # On a GPU, int() of a count computed there waits for every step queued before it: inside the timed step
    trainer = Trainer(lm_cfg.replace(grad_accum=2))
    batch = text.collate([trainer.train_split[i] for i in range(8)])
    original = text.TokenBatch.to

    def to_device(self, device, non_blocking=False):
        moved = original(self, device, non_blocking)
        moved.labels = moved.labels.as_subclass(_OnDevice)
        return moved

    monkeypatch.setattr(text.TokenBatch, "to", to_device)
    loss = trainer.accumulate(batch)  # each micro-batch's loss over the step's label tokens, counted on the host
    monkeypatch.setattr(text.TokenBatch, "to", original)
    expected = Trainer(lm_cfg.replace(grad_accum=2))
    assert torch.allclose(loss.as_subclass(torch.Tensor), expected.accumulate(batch))
