"""Language models on two CPU processes over gloo: DDP and FSDP2 train what one process trains on the global batch,
because the loss divides by the job's label tokens; each rank's own mean (the pitfall) does not. (A language model's
rank that dies: tests/test_launcher.py.)"""


import pytest
import torch
from torch import nn

import labkit
from labkit import launcher, text
from labkit.errors import ConfigError, UnsupportedError
from labkit.kinds.language import LanguageKind
from labkit.labs import distributed as lab
from labkit.techniques import distributed
from labkit.techniques.distributed import weights_difference

two_cores = pytest.mark.skipif(launcher.cpu_cores() < 2, reason="two CPU processes need two cores")
FLOAT_TOLERANCE = 1e-5  # one process against two: the same sums, added in another order (measured 7e-7)


@pytest.fixture(scope="module")
def cfg():
    """LoRA, per-layer checkpointing and packed rows: notebook 07's check cells run the full fine-tune, padded, on both
    strategies against one process (its `ci` workload); unscored: each rank would score the whole test split."""
    return labkit.RunConfig(model="tiny_llama", dataset="pydoc_text", batch_size=8, max_steps=6, train_size=64,
                            device="cpu", evaluate=False, lora_rank=4, checkpointing=True, packing="pack")


@pytest.fixture(scope="module")
def jobs(cfg):
    """One process, DDP and FSDP2 on two, and DDP with each rank's own token mean."""
    return {"one": launcher.launch(cfg, nproc=1, progress=False),
            "ddp": launcher.launch(cfg, nproc=2, progress=False),
            "fsdp": launcher.launch(cfg, nproc=2, strategy="fsdp", progress=False),
            "rank": launcher.launch(cfg, nproc=2, token_mean="rank", progress=False)}


def sample(job):
    return job.distributed["weights_sample"]


@two_cores
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_the_one_process_weights(jobs, strategy):
    one, two = jobs["one"], jobs[strategy]
    assert two.distributed["strategy"] == strategy and two.distributed["world_size"] == 2
    assert len({r["parameters_sha256"] for r in two.distributed["ranks"]}) == 1  # identical on both ranks
    assert weights_difference(sample(one), sample(two)) < FLOAT_TOLERANCE
    assert torch.allclose(torch.tensor(one.losses), torch.tensor(two.losses), rtol=1e-5, atol=1e-6)
    # the job's tokens are every rank's: the same tokens as one process's over the same global batches
    assert sum(r["counts"]["label_tokens"] for r in two.distributed["ranks"]) == \
        one.distributed["ranks"][0]["counts"]["label_tokens"]
    assert two.tokens_per_s == pytest.approx(sum(r["counts"]["tokens"] for r in two.distributed["ranks"])
                                             / sum(two.step_times_s))
    assert two.num_trainable_params == one.num_trainable_params < one.num_params / 10  # LoRA's adapters only


@two_cores
def test_each_ranks_own_token_mean_is_not_the_global_batchs(jobs):
    ranks = jobs["rank"].distributed["ranks"]
    assert ranks[0]["counts"]["label_tokens"] != ranks[1]["counts"]["label_tokens"]  # uneven, or this proves nothing
    pitfall = weights_difference(sample(jobs["one"]), sample(jobs["rank"]))
    assert pitfall > 100 * FLOAT_TOLERANCE
    assert pitfall > 100 * weights_difference(sample(jobs["one"]), sample(jobs["ddp"]))


@two_cores
def test_fsdp_holds_half_the_weights_gradients_and_state_per_rank(jobs):
    ddp, fsdp = jobs["ddp"].distributed["ranks"][0], jobs["fsdp"].distributed["ranks"][0]
    for part in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"):
        assert fsdp[part] == pytest.approx(ddp[part] / 2, rel=0.01), part
    assert fsdp["memory"]["optimizer_state"] < 0.6 * ddp["memory"]["optimizer_state"]
    assert set(fsdp["memory"]) >= {"parameters", "gradients", "optimizer_state", "activations"}
    assert jobs["fsdp"].distributed["communication"]["allreduce_s"] > 0  # gloo's all-gather and reduce-scatter


def test_what_a_process_group_cannot_run_is_refused_with_the_reason(cfg):
    with pytest.raises(ConfigError, match=r"loss_chunks=4 is not allowed: None in a process group.*outside the "
                                          r"wrapped model's forward"):
        LanguageKind().check_world(cfg.replace(loss_chunks=4), 2, True)
    LanguageKind().check_world(cfg, 2, True)

    class Params4bit(nn.Parameter):  # bitsandbytes' class, by name
        pass

    model = nn.Linear(4, 4)
    model.weight = Params4bit(torch.zeros(4, 4), requires_grad=False)
    with pytest.raises(UnsupportedError, match=r"strategy='fsdp' cannot run here: weight is a bitsandbytes 4-bit "
                                               r"weight \(QLoRA\).*strategy='ddp'"):
        distributed.check_shardable(model)
    with pytest.raises(ConfigError, match=r"token_mean='mean' is not allowed: one of \['global', 'rank'\]"):
        launcher.launch(cfg, token_mean="mean")


def test_packed_rows_get_a_distributed_sampler_over_the_rows(cfg):
    split = text.load_text_splits("pydoc_text", 64, 8, 8, 128, seed=0)["train"]
    given = torch.utils.data.distributed.DistributedSampler(range(len(split)), num_replicas=2, rank=1, seed=3)
    loader = text.make_token_loader(split, 4, "pack", sampler=given, seed=3)
    rows = loader.sampler.sampler
    assert len(rows.dataset) == len(loader.dataset) < len(split)
    assert (rows.num_replicas, rows.rank, rows.seed) == (2, 1, 3)
    assert text.make_token_loader(split, 4, "pad", sampler=given).sampler.sampler is given


def test_the_loss_divisor_is_the_count_outside_a_group():
    assert distributed.loss_divisor(37, torch.device("cpu")).item() == 37.0
    assert distributed.loss_divisor(0, torch.device("cpu")).item() == 1.0


@two_cores
def test_notebook_07s_language_jobs_read_the_jobs_rank_by_rank(cfg, jobs):
    result = lab.language_jobs(cfg, progress=False)  # the same jobs as the fixture's: from the cache
    assert list(result.frame.job) == list(lab.language.JOBS)
    ddp, pitfall = result.row("DDP"), result.row("DDP, each rank's own mean")
    assert ddp.weight_gap == weights_difference(sample(jobs["one"]), sample(jobs["ddp"]))
    assert ddp.label_tokens_per_rank == pitfall.label_tokens_per_rank != ""
    assert result.row("1 process").efficiency == 1.0
    assert ddp.efficiency == pytest.approx(jobs["ddp"].tokens_per_s / (2 * jobs["one"].tokens_per_s))
    ranks = result.ranks
    assert list(ranks.job.unique()) == ["DDP", "FSDP2", "DDP, each rank's own mean"]
    assert list(ranks["process_rank"][:2]) == [0, 1]
    assert (ranks.activations_at_peak_bytes > 0).all()
    finding = " ".join(str(result.finding()).split())
    assert f"DDP's ended {ddp.weight_gap:.1e}" in finding and "x further" in finding and "FSDP2 peaked at" in finding
    assert lab.language_workload(labkit.profile("ci")).model == "tiny_llama"
