"""labkit: a Jupyter-first lab for making PyTorch fine-tuning faster and lighter, measured correctly.

Importing labkit pulls in no notebook-only package (ipywidgets is imported by `labkit.widgets` alone),
so `labkit bench` runs on a bare GPU machine; nor bitsandbytes, imported when an 8-bit optimizer is built.

The engine's layers, lowest first (each module imports only from its own layer or lower ones; the
import-linter contract in pyproject.toml checks it): the base (`errors`, `project`, `validate`, `units`,
`machine`, `env`, `downloads`, `data`, `models`, `config`, `result`, `measure`, `exercises`, `guesses`, `display`);
`techniques` (each technique's mechanism); `train` (the loop); `results`, `capacity`, `pretrain`, `equivalence`
(many runs, what fits, a plain step against the engine's); `estimates`; `labs` (each notebook's experiments,
findings and exercises); `plots`, `views`, `widgets`, and `troubleshoot` (`labkit.doctor`: probes a config for the
troubleshooting table's symptoms); `bench`, `cli`.
"""

from .capacity import estimate_memory, find_max_batch_size, training_memory
from .config import RunConfig
from .configfile import load_config, save_config
from .env import env_report, profile
from .finetune import Finetune
from .project import __version__
from .result import RunResult
from .results import load_reference, sweep
from .train import fit
from .troubleshoot import doctor

__all__ = [
    "Finetune",
    "RunConfig",
    "RunResult",
    "__version__",
    "doctor",
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
