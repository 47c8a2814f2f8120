"""`RunConfig` in YAML files: `load_config` (YAML 1.1 with ``1e-3`` read as a number), `save_config`, `parse_yaml`."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .config import RunConfig
from .errors import ConfigError


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; a lab config means the number."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$|" r"^[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?$|"
               r"^[-+]?[0-9][0-9_]*\.[0-9_]*$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, source: str):
    """Parse YAML text, reading ``1e-3`` as a float; a syntax error becomes a `ConfigError` naming ``source``."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(source, text if len(text) < 60 else text[:57] + "...", "valid YAML", str(exc)) from exc


def load_config(path: str | Path) -> RunConfig:
    """Load a `RunConfig` from a YAML mapping; unknown keys and non-mappings raise `ConfigError`.

    Example:
        >>> cfg = labkit.load_config("recipe.yaml")
    """
    path = Path(path)
    loaded = parse_yaml(path.read_text(), path.name)
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path.name}", type(loaded).__name__,
                          "a YAML mapping of RunConfig fields (e.g. 'batch_size: 64')")
    return RunConfig.from_dict(loaded, source=path.name)


def save_config(cfg: RunConfig, path: str | Path) -> Path:
    """Write ``cfg`` as YAML; `load_config` reads it back unchanged."""
    path = Path(path)
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return path
