"""Section 5 of notebook 05: with only the head training, the body's output computed once and the head trained
on it, against head-only training through the whole network."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, RandomSampler

from ... import data, evaluation, measure, models, results, train
from ...config import RunConfig
from ...env import env_report
from ...labresult import LabResult
from ...measure import compare
from ...messages import worded
from ...techniques.freezing import cache_features
from ...techniques.precision import autocast
from ...units import mib
from ...validate import check_positive_int
from .common import _duration


@dataclass
class FeatureCaching(LabResult):
    """Head-only training through the network and on cached features (``frame``: ``method``, ``epoch_time_s``,
    the median epoch, ``accuracy``); building the cache took ``extract_s`` and ``cache_bytes``; the two heads'
    largest relative weight difference; ``epoch_times_s``: method -> every epoch's time (None: not kept)."""

    shown = ("method", "epoch_time_s", "accuracy")
    extract_s: float = 0.0
    cache_bytes: int = 0
    head_weight_diff: float = 0.0
    epochs: int = 1
    epoch_times_s: dict | None = None

    @property
    def speedup(self) -> float:
        """Head-only epoch time through the network / epoch time on the cached features."""
        by = self.frame.set_index("method")
        return by.loc["through the network", "epoch_time_s"] / by.loc["cached features", "epoch_time_s"]

    @worded
    def finding(self) -> str:
        by = self.frame.set_index("method")
        through, cached = by.loc["through the network", "epoch_time_s"], by.loc["cached features", "epoch_time_s"]
        times = self.epoch_times_s or {}
        c = compare(times.get("cached features", cached), times.get("through the network", through),
                    ("faster", "slower"))
        text = (f"An epoch took {_duration(through)} through the network and {_duration(cached)} on the cache "
                f"({self.speedup:.1f}x faster, over the epochs {c.verdict}); building the cache took "
                f"{_duration(self.extract_s)} and {mib(self.cache_bytes, '.3g')}, ")
        gain = through - cached
        if gain <= 0:
            return text + "so here it never pays."
        total = self.extract_s + self.epochs * cached
        return text + (f"so it paid for itself after {self.extract_s / gain:.2f} epochs ({_duration(total)} in all "
                       f"over {self.epochs} epochs, against {_duration(self.epochs * through)}).")


def _synchronized_time(device: torch.device, start: float) -> float:
    measure.synchronize(device)
    return time.perf_counter() - start


def _head_step(trainer: train.Trainer, features: torch.Tensor, labels: torch.Tensor) -> None:
    """The engine's step on a batch of cached body outputs: forward through the head only."""
    with autocast(trainer.precision, trainer.device):
        loss = F.cross_entropy(models.forward_head(trainer.model, features), labels)
    trainer.scaler.scale(loss).backward()
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.optimizer.zero_grad(set_to_none=True)


def _rng(device: torch.device, state=None):
    """The CPU (and CUDA) random state, set to ``state`` first where given."""
    cuda = device.type == "cuda"
    if state is not None:
        torch.set_rng_state(state[0])
    if state is not None and cuda:
        torch.cuda.set_rng_state(state[1], device)
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if cuda else None


def _caching_record(cfg: RunConfig, epochs: int) -> dict:
    through = train.Trainer(cfg)
    device = through.device
    rng = {"through": _rng(device)}
    cached = train.Trainer(cfg)  # the same random seed: the same head to start from, the same batch order
    split = cached.train_split
    order = data.make_loader(split, batch_size=max(cfg.batch_size, 256), shuffle=False)
    start = time.perf_counter()
    features = cache_features(cached.model, (data.to_model_input(images, split, device, cfg.channels_last,
                                                                 cfg.image_size) for images, _ in order))
    extract_s = _synchronized_time(device, start)
    labels_all = split.labels.to(device)
    batches = BatchSampler(RandomSampler(range(len(split)), generator=torch.Generator().manual_seed(cfg.seed)),
                           cfg.batch_size, drop_last=True)  # the order the Trainer's loader draws
    rng["cached"] = _rng(device)

    def through_epoch():
        for images, labels in through.loader:
            through.step(images, labels)

    def cached_epoch():
        for indices in batches:
            index = torch.as_tensor(indices, device=device)
            _head_step(cached, features[index], labels_all[index])

    # Epochs taken in turns, every other round in the other order, so that a busy spell of the machine slows both
    # ways alike; each way keeps its own random state, as if it ran alone.
    times = {"through": [], "cached": []}
    for epoch in range(epochs):
        for way in (("through", "cached") if epoch % 2 == 0 else ("cached", "through")):
            _rng(device, rng[way])
            start = time.perf_counter()
            (through_epoch if way == "through" else cached_epoch)()
            times[way].append(_synchronized_time(device, start))
            rng[way] = _rng(device)

    test = through.splits["test"]
    heads = [dict(models.named_stages(t.model))["head"] for t in (through, cached)]
    pairs = list(zip(heads[0].parameters(), heads[1].parameters(), strict=True))
    largest = max(float(a.detach().abs().max()) for a, _ in pairs)
    diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in pairs) / largest
    accuracy = [evaluation.evaluate(t.model, test, cfg, device, t.precision) for t in (through, cached)]
    return {"epoch_times_through_s": times["through"], "epoch_times_cached_s": times["cached"],
            "extract_s": extract_s,
            "cache_bytes": features.untyped_storage().nbytes(), "head_weight_diff": diff,
            "accuracy_through": accuracy[0], "accuracy_cached": accuracy[1], "steps_per_epoch": len(through.loader)}


def feature_caching(cfg: RunConfig, epochs: int = 3, refresh: bool = False) -> FeatureCaching:
    """Head-only training two ways, ``epochs`` epochs each from the same start on the same batches: through the
    whole frozen network every step, and on the body's output computed once (`cache_features`). ``cfg`` runs at
    ``freeze="head_only"`` with one plain step (no warm-up, accumulation or clipping). Cached."""
    check_positive_int("epochs", epochs)
    run = cfg.replace(freeze="head_only", lr_warmup_steps=0, grad_accum=1, grad_clip=None, max_steps=None, epochs=1)
    key = f"{results.cache_key(run, env_report(cfg.device))}-feature-caching-{epochs}"
    record = results.cached_record(key, lambda: _caching_record(run, epochs), refresh)
    times = {"through the network": record["epoch_times_through_s"], "cached features": record["epoch_times_cached_s"]}
    frame = pd.DataFrame({"method": list(times), "epoch_time_s": [statistics.median(t) for t in times.values()],
                          "accuracy": [record["accuracy_through"], record["accuracy_cached"]]})
    return FeatureCaching(frame, record["extract_s"], record["cache_bytes"], record["head_weight_diff"], epochs,
                          times)
