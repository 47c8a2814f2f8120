"""labkit's own pretrained weights, shipped with their sha256 (`SHIPPED_CHECKPOINTS`, the manifest): where they
are (`checkpoint_dir`), `save_checkpoint` and `load_checkpoint`, which refuses a file whose digest differs."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch

from ..env import OFFLINE_ENV, is_online  # noqa: F401 - is_online is part of this module's API
from ..errors import ChecksumError, ConfigError

CHECKPOINT_DIR_ENV = "LABKIT_CHECKPOINT_DIR"


MANIFEST_NAME = "manifest.json"


# Models small enough (a few MB) for labkit to ship offline checkpoints of (`labkit pretrain`).
SHIPPED_CHECKPOINTS = ("small_cnn", "shufflenet_v2_x0_5", "tiny_vit", "tiny_llama")


def checkpoint_dir() -> Path:
    """Where labkit's own pretrained checkpoints and their ``manifest.json`` live.

    ``$LABKIT_CHECKPOINT_DIR`` if set, else the package's ``assets/checkpoints`` (shipped with labkit).

    Example:
        >>> labkit.models.checkpoint_dir().name
        'checkpoints'
    """
    if os.environ.get(CHECKPOINT_DIR_ENV):
        return Path(os.environ[CHECKPOINT_DIR_ENV]).expanduser()
    return Path(__file__).resolve().parents[1] / "assets" / "checkpoints"


def _read_manifest() -> dict:
    path = checkpoint_dir() / MANIFEST_NAME
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checkpoint(state: dict, name: str, meta: dict) -> Path:
    """Write ``state`` (a state_dict) as ``<name>.pt`` and record its sha256 and ``meta`` in ``manifest.json``."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError("name", name, "a file name of letters, digits, '_', '.' or '-'")
    if not isinstance(meta, dict) or {"file", "sha256"} & set(meta):
        raise ConfigError("meta", meta, "a dict without the keys 'file' and 'sha256' (labkit writes those)")
    try:
        json.dumps(meta)
    except TypeError as exc:
        raise ConfigError("meta", meta, f"JSON-serialisable values ({exc})") from exc
    directory = checkpoint_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    manifest = _read_manifest()
    manifest[name] = {"file": path.name, "sha256": _sha256(path), **meta}
    tmp = directory / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, directory / MANIFEST_NAME)
    return path


def load_checkpoint(name: str) -> dict:
    """The state_dict (without head) of checkpoint ``name``, after checking its sha256 against the manifest.

    Example:
        >>> state = labkit.models.load_checkpoint("small_cnn")
    """
    manifest = _read_manifest()
    manifest_path = checkpoint_dir() / MANIFEST_NAME
    if name not in manifest:
        raise ConfigError("checkpoint", name, f"one of {sorted(manifest)} (listed in {manifest_path})",
                          "Create it with `labkit pretrain`")
    entry = manifest[name]
    path = checkpoint_dir() / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is listed in {manifest_path} but missing: re-run `labkit pretrain` "
                                "or restore the file (e.g. `git checkout -- <path>`).")
    actual = _sha256(path)
    if actual != entry["sha256"]:
        raise ChecksumError(
            f"{path} is corrupted or was changed: its sha256 is {actual}, but {MANIFEST_NAME} expects "
            f"{entry['sha256']}. Re-run `labkit pretrain` to rebuild it, or restore the file "
            "(e.g. `git checkout -- <path>`)."
        )
    return torch.load(path, map_location="cpu", weights_only=True)
