"""Notebook 07, section 3: one process against N on the same global batch, so the same training."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ...config import RunConfig
from ...labresult import LabResult
from ...launcher import launch
from ...messages import worded
from ...ranks import jobs_frame
from ...result import RunResult

EARLY_STEPS = 10  # before GPU non-determinism has grown


@dataclass
class Equivalence(LabResult):
    shown = ("world_size", "samples_per_rank", "step_time_s", "final_loss", "accuracy", "identical_weights")
    one: RunResult | None = None
    many: RunResult | None = None

    @property
    def curves(self) -> pd.DataFrame:
        n = self.many.distributed["world_size"]
        frame = pd.DataFrame({"step": range(1, len(self.one.losses) + 1), "loss_1": self.one.losses,
                              f"loss_{n}": self.many.losses})
        frame["loss_difference"] = (frame["loss_1"] - frame[f"loss_{n}"]).abs()
        return frame

    @property
    def max_difference(self) -> float:
        return float(self.curves["loss_difference"].max())

    @property
    def early_difference(self) -> float:
        return float(self.curves["loss_difference"].iloc[:EARLY_STEPS].max())

    def _same(self, part: str) -> bool:
        ranks = self.many.distributed["ranks"]
        key = f"{part}_sha256" if f"{part}_sha256" in ranks[0] else "weights_sha256"  # a job cached before the split
        return len({r[key] for r in ranks}) == 1

    @property
    def identical_weights(self) -> bool:
        return self._same("parameters")

    @property
    def identical_buffers(self) -> bool:
        return self._same("buffers")

    @worded
    def finding(self) -> str:
        n, batch = self.many.distributed["world_size"], self.one.config["batch_size"]
        digests = ", ".join(d[:8] for d in self.many.distributed["weights_sha256"])
        weights = "identical parameters on every rank" if self.identical_weights else f"parameters DIFFER ({digests})"
        if self.identical_weights and not self.identical_buffers:
            weights += " (BatchNorm's running statistics differ: each rank keeps those of its own samples)"
        return (f"Global batch {batch}, 1 process against {n} of {batch // n}: loss curves within "
                f"{self.max_difference:.1e} over {len(self.one.losses)} steps, {weights}, test accuracy "
                f"{self.one.accuracy:.1%} and {self.many.accuracy:.1%}.")


def equivalence(cfg: RunConfig, nproc: int = 2, progress: bool = True) -> Equivalence:
    """``cfg`` on one process and on ``nproc``: the same global batches."""
    one, many = launch(cfg, nproc=1, progress=progress), launch(cfg, nproc=nproc, progress=progress)
    return Equivalence(jobs_frame([one, many]), one=one, many=many)
