"""A learner's own images: a folder with a subfolder per class (torchvision's ``ImageFolder`` layout), as the
train, val and test `labkit.data.ImageData` splits a run uses.

Every image is decoded once, converted to RGB and resized to ``size`` x ``size`` (`FOLDER_IMAGE_SIZE` by default; a
run's ``image_size`` resizes again on the device), so the whole set is one uint8 tensor in memory. A folder that
already holds ``train``/``val``/``test`` subfolders (each with a subfolder per class) keeps that split; otherwise a
seeded split per class holds out 10 % for validation and 10 % for test (at least one image each), stated. The
normalisation is the training split's own mean and standard deviation. Files that are not images are counted and
reported, never silently skipped.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from .data import SPLITS, ImageData, load_splits
from .errors import ConfigError
from .messages import note

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
FOLDER_IMAGE_SIZE = 64
HELD_OUT = 0.1


def _class_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def is_image_folder(spec) -> bool:
    """Whether ``spec`` is a folder of class subfolders (or of train/val/test folders of them)."""
    if not isinstance(spec, str) or not Path(spec).expanduser().is_dir():
        return False
    return len(_class_dirs(Path(spec).expanduser())) >= 2 or (Path(spec).expanduser() / "train").is_dir()


def _load_class_images(folder: Path, classes: list[str], size: int) -> tuple[list, list, list[str]]:
    from PIL import Image  # torchvision's dependency

    images, labels, unreadable = [], [], []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).rglob("*")):
            if not path.is_file():
                continue
            try:
                with Image.open(path) as image:
                    rgb = image.convert("RGB").resize((size, size), Image.BILINEAR)
            except Exception:  # not an image, or a broken one
                unreadable.append(str(path.relative_to(folder)))
                continue
            images.append(np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1).copy())
            labels.append(label)
    return images, labels, unreadable


def _split_indices(labels: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    parts = {"train": [], "val": [], "test": []}
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        if len(members) < 3:
            raise ConfigError("dataset", f"class {label} with {len(members)} images",
                              "at least 3 images per class (train, val and test take one each at least)")
        held = max(1, round(HELD_OUT * len(members)))
        parts["test"] += list(members[:held])
        parts["val"] += list(members[held:2 * held])
        parts["train"] += list(members[2 * held:])
    return {k: np.sort(np.asarray(v, dtype=np.int64)) for k, v in parts.items()}


def _stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    pixels = images.float().div(255).transpose(0, 1).reshape(3, -1)
    return tuple(pixels.mean(1).tolist()), tuple(pixels.std(1).clamp_min(1e-3).tolist())


@functools.lru_cache(maxsize=4)
def load_folder_splits(spec: str, size: int = FOLDER_IMAGE_SIZE, seed: int = 0) -> dict[str, ImageData]:
    """The folder's ``train``, ``val`` and ``test`` splits (see the module).

    Example:
        >>> splits = load_folder_splits("my_photos")   # my_photos/cat/*.jpg, my_photos/dog/*.jpg
        >>> splits["train"].classes
        ['cat', 'dog']
    """
    folder = Path(spec).expanduser()
    presplit = (folder / "train").is_dir()
    classes = [p.name for p in _class_dirs(folder / "train" if presplit else folder)]
    if len(classes) < 2:
        raise ConfigError("dataset", spec, "a folder with a subfolder per class (at least 2), each holding images",
                          f"found {classes or 'no subfolders'}")
    loaded, unreadable = {}, []
    for part in (SPLITS if presplit else ("all",)):
        images, labels, bad = _load_class_images(folder / part if presplit else folder, classes, size)
        if not images:
            raise ConfigError("dataset", str(folder / part if presplit else folder),
                              f"image files ({', '.join(IMAGE_SUFFIXES)}) in its class subfolders",
                              "none could be read")
        loaded[part] = (torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64))
        unreadable += bad
    if not presplit:
        images, labels = loaded.pop("all")
        loaded = {k: (images[i], labels[i]) for k, i in _split_indices(labels.numpy(), seed).items()}
        note(f"{spec}: one folder of images, split per class (seed {seed}) into train/val/test = "
             f"{len(loaded['train'][1])}/{len(loaded['val'][1])}/{len(loaded['test'][1])}")
    if unreadable:
        note(f"{spec}: {len(unreadable)} files are not images and were left out, e.g. {unreadable[:3]}")
    mean, std = _stats(loaded["train"][0])
    name = folder.name or spec
    return {split: ImageData(name, split, loaded[split][0], loaded[split][1], list(classes), mean, std)
            for split in SPLITS}


def write_image_folder(path: str | Path, dataset: str = "shapes10", per_class: int = 12, seed: int = 0) -> Path:
    """A folder of PNG files, a subfolder per class, drawn from labkit's generated ``dataset``: a learner-shaped
    image folder made offline (tests, notebook 11).

    Example:
        >>> write_image_folder("my_shapes", per_class=20)   # my_shapes/circle/0.png, ...
    """
    from PIL import Image  # torchvision's dependency

    split = load_splits(dataset, per_class * 20, 10, 10, seed=seed)["train"]
    path = Path(path)
    for label, name in enumerate(split.classes):
        members = (split.labels == label).nonzero().flatten()[:per_class]
        (path / name).mkdir(parents=True, exist_ok=True)
        for index, member in enumerate(members.tolist()):
            Image.fromarray(split.images[member].permute(1, 2, 0).numpy()).save(path / name / f"{index}.png")
    return path
