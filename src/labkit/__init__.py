"""labkit: a Jupyter-first lab for making PyTorch fine-tuning faster and lighter, measured correctly.

Importing labkit pulls in no notebook-only package (ipywidgets is imported by `labkit.widgets` alone),
so `labkit bench` runs on a bare GPU machine; nor bitsandbytes, imported when an 8-bit optimizer is built.
"""

__version__ = "0.1.0"

from .config import RunConfig, load_config, save_config  # noqa: E402
from .env import env_report, profile  # noqa: E402
from .result import RunResult  # noqa: E402
from .results import load_reference, sweep  # noqa: E402
from .techniques.batching import estimate_memory, find_max_batch_size  # noqa: E402
from .techniques.memory import training_memory  # noqa: E402
from .train import fit  # noqa: E402

__all__ = [
    "RunConfig",
    "RunResult",
    "env_report",
    "estimate_memory",
    "find_max_batch_size",
    "fit",
    "load_config",
    "load_reference",
    "profile",
    "save_config",
    "sweep",
    "training_memory",
]
