"""Notebook 07, section 3: one process against N on the same global batch, so the same training."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ...config import RunConfig
from ...messages import worded
from ...result import RunResult
from .jobs import launch

EARLY_STEPS = 10


@dataclass
class Equivalence:
    """One process against N on the same global batch (`equivalence`)."""

    one: RunResult
    many: RunResult

    @property
    def frame(self) -> pd.DataFrame:
        """``step``, ``loss_1``, ``loss_N`` and their ``loss_difference``."""
        n = self.many.distributed["world_size"]
        frame = pd.DataFrame({"step": range(1, len(self.one.losses) + 1), "loss_1": self.one.losses,
                              f"loss_{n}": self.many.losses})
        frame["loss_difference"] = (frame["loss_1"] - frame[f"loss_{n}"]).abs()
        return frame

    @property
    def max_difference(self) -> float:
        """The largest loss difference over the run."""
        return float(self.frame["loss_difference"].max())

    @property
    def early_difference(self) -> float:
        """The largest loss difference over the first `EARLY_STEPS` steps, before GPU non-determinism has grown."""
        return float(self.frame["loss_difference"].iloc[:EARLY_STEPS].max())

    def _same(self, part: str) -> bool:
        ranks = self.many.distributed["ranks"]
        key = f"{part}_sha256" if f"{part}_sha256" in ranks[0] else "weights_sha256"  # a job cached before the split
        return len({r[key] for r in ranks}) == 1

    @property
    def identical_weights(self) -> bool:
        """Whether every rank of the N-process job ended with the same parameters (what DDP keeps equal)."""
        return self._same("parameters")

    @property
    def identical_buffers(self) -> bool:
        """Whether the ranks' buffers (BatchNorm's running statistics) are equal too: without SyncBatchNorm (gloo,
        FSDP) each rank keeps the statistics of its own samples."""
        return self._same("buffers")

    @worded
    def finding(self) -> str:
        """One line: how far apart the loss curves, the ranks' weights and the accuracies ended."""
        n, batch = self.many.distributed["world_size"], self.one.config["batch_size"]
        digests = ", ".join(d[:8] for d in self.many.distributed["weights_sha256"])
        weights = "identical parameters on every rank" if self.identical_weights else f"parameters DIFFER ({digests})"
        if self.identical_weights and not self.identical_buffers:
            weights += " (BatchNorm's running statistics differ: each rank keeps those of its own samples)"
        return (f"Global batch {batch}, 1 process against {n} of {batch // n}: loss curves within "
                f"{self.max_difference:.1e} over {len(self.one.losses)} steps, {weights}, test accuracy "
                f"{self.one.accuracy:.1%} and {self.many.accuracy:.1%}.")


def equivalence(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> Equivalence:
    """`launch` ``cfg`` on one process and on ``nproc``: the same global batches, so the same training.

    Args:
        cfg: the run. nproc: the processes of the second job. progress: show the bars.
    """
    return Equivalence(launch(cfg, nproc=1, progress=progress), launch(cfg, nproc=nproc, progress=progress))
