"""Datasets by name, held in memory as uint8 tensors, and fast seeded loaders.

Three datasets, all 3x32x32 images in 10 classes:

- ``cifar10``: the real CIFAR-10, through torchvision (downloaded once into `cache_dir()`).
- ``shapes10``: generated on the fly, offline, deterministic: one shape per image (circle, square, ...)
  on a noisy, shaded background in random colours. The fine-tuning task when there is no network.
- ``shapes_source``: the same rendering with 10 *different* shapes. labkit pretrains its own small
  checkpoints on it, so that fine-tuning on ``shapes10`` starts from weights learned on another task.

`load_splits` gives identical tensors for the same arguments. Generated datasets draw each split from its own
seed (derived from the dataset, the split and ``seed``); CIFAR-10 takes train and val from one seeded
permutation of its 50,000 training images and test from its 10,000 test images.

`make_loader` gathers each batch in one indexing call, in the main process (no worker start-up cost). With
``shuffle`` the order comes from a generator seeded by ``seed``: the same seed gives the same batches, and each
new pass over the loader draws a new (still seeded) order. `to_model_input` copies the uint8 batch to the device
first (4x fewer bytes than float32) and converts it there; its ``size`` resizes there too, e.g. 32x32 CIFAR-10
to 128x128 for an ImageNet-pretrained ResNet.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from .downloads import (  # where downloads live; part of this module's API
    CIFAR10_URL,
    DATA_DIR_ENV,
    cache_dir,
    download_timeout,
    on_disk,
)
from .env import is_online
from .errors import ConfigError, DatasetUnavailableError
from .validate import is_int

SPLITS = ("train", "val", "test")
IMAGE_SHAPE = (3, 32, 32)

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


@dataclass(frozen=True)
class ShapesStyle:
    """How hard the generated shapes datasets are. Tune here; every knob is in pixels, degrees or [0, 1] units.

    Attributes:
        noise_std: std of the gaussian pixel noise (on the [0, 1] intensity scale).
        gradient_amplitude: the largest brightness change of the soft lighting gradient, edge to centre.
        min_contrast: the smallest luminance difference between shape and background.
        radius_px: (low, high) of the shape's radius (half its size) in pixels.
        rotation_deg: shapes are rotated by a uniform angle in [-rotation_deg, rotation_deg].
        edge_softness_px: width of the anti-aliased edge.
        centre_margin: the centre stays at least ``centre_margin * radius`` pixels from the border, so a
            shape may be clipped a little at the border but never lost.
    """

    noise_std: float = 0.10
    gradient_amplitude: float = 0.25
    min_contrast: float = 0.20
    radius_px: tuple[float, float] = (5.0, 12.0)
    rotation_deg: float = 20.0
    edge_softness_px: float = 1.0
    centre_margin: float = 0.8


SHAPES_STYLE = ShapesStyle()
_GENERATE_CHUNK = 2048  # images rendered at once: bounds the float32 working memory to ~40 MB


# --- shapes as signed distance functions in normalised, rotated coordinates -----------------------
# u points right, v points down (image rows); the shape's radius is 1. Negative inside, positive outside,
# in units of the radius (so sdf * radius_px is roughly a distance in pixels, which sets the anti-aliasing).


def _box(u, v, half_u, half_v):
    return np.maximum(np.abs(u) - half_u, np.abs(v) - half_v)


def _disc(u, v, radius, du=0.0, dv=0.0):
    return np.hypot(u - du, v - dv) - radius


def _rotate(u, v, deg):
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return c * u + s * v, -s * u + c * v


def _triangle(u, v, inradius):
    # Equilateral with the apex up (v points down): one edge normal points down, two up-left and up-right.
    normals = [(np.cos(np.radians(a)), np.sin(np.radians(a))) for a in (90.0, 210.0, 330.0)]
    return np.maximum.reduce([u * nx + v * ny for nx, ny in normals]) - inradius


def _rhombus(u, v, half_u, half_v):
    # A tall diamond: not 90-degree symmetric, so it never looks like a rotated square.
    return (np.abs(u) / half_u + np.abs(v) / half_v - 1.0) / np.hypot(1.0 / half_u, 1.0 / half_v)


def _cross(u, v, angle_deg, half_len=0.95, half_width=0.22):
    # Two bars crossing at +-angle_deg from the vertical.
    return np.minimum(_box(*_rotate(u, v, angle_deg), half_width, half_len),
                      _box(*_rotate(u, v, -angle_deg), half_width, half_len))


SHAPES10_CLASSES = {
    "circle": lambda u, v: _disc(u, v, 0.9),
    "square": lambda u, v: _box(u, v, 0.75, 0.75),
    "triangle": lambda u, v: _triangle(u, v, 0.5),
    "ring": lambda u, v: np.abs(np.hypot(u, v) - 0.75) - 0.22,
    "hollow_square": lambda u, v: np.abs(_box(u, v, 0.72, 0.72)) - 0.2,
    "plus": lambda u, v: np.minimum(_box(u, v, 0.95, 0.24), _box(u, v, 0.24, 0.95)),
    # Arms 60 degrees apart (not 90): at any rotation it differs from the plus.
    "x_cross": lambda u, v: _cross(u, v, 30.0),
    "horizontal_bar": lambda u, v: _box(u, v, 0.95, 0.3),
    "vertical_bar": lambda u, v: _box(u, v, 0.3, 0.95),
    "diamond": lambda u, v: _rhombus(u, v, 0.6, 1.0),
}

SHAPES_SOURCE_CLASSES = {
    "h_ellipse": lambda u, v: (np.hypot(u, v / 0.5) - 1.0) * 0.5,
    "v_ellipse": lambda u, v: (np.hypot(u / 0.5, v) - 1.0) * 0.5,
    "hollow_triangle": lambda u, v: np.abs(_triangle(u, v, 0.45)) - 0.14,
    "hollow_diamond": lambda u, v: np.abs((np.abs(u) + np.abs(v) - 1.0) / np.sqrt(2.0)) - 0.14,
    "two_dots": lambda u, v: np.minimum(_disc(u, v, 0.4, du=-0.55), _disc(u, v, 0.4, du=0.55)),
    "t_shape": lambda u, v: np.minimum(_box(u, v + 0.65, 0.9, 0.25), _box(u, v - 0.175, 0.25, 0.825)),
    "l_shape": lambda u, v: np.minimum(_box(u + 0.65, v, 0.25, 0.9), _box(u, v - 0.65, 0.9, 0.25)),
    "half_disc": lambda u, v: np.maximum(_disc(u, v, 1.0, dv=0.4), v - 0.4),
    # A 2x2 checkerboard: two opposite quadrants of a square, with a small gap between them.
    "checker": lambda u, v: np.maximum(_box(u, v, 0.85, 0.85),
                                       -np.sign(u * v) * np.minimum(np.abs(u), np.abs(v)) + 0.08),
    "asterisk": lambda u, v: np.minimum.reduce([_box(*_rotate(u, v, a), 0.18, 0.95) for a in (0.0, 60.0, 120.0)]),
}

_SHAPES = {"shapes10": SHAPES10_CLASSES, "shapes_source": SHAPES_SOURCE_CLASSES}
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def available() -> list[str]:
    """The dataset names `load_splits` accepts.

    Example:
        >>> labkit.data.available()
        ['cifar10', 'shapes10', 'shapes_source']
    """
    return ["cifar10", "shapes10", "shapes_source"]


@dataclass
class ImageData:
    """One split of a dataset, in memory. Treat the tensors as read-only: they may be shared with a cache.

    Attributes:
        name: the dataset name; split: ``train``, ``val`` or ``test``.
        images: uint8 tensor [N, 3, 32, 32]; labels: int64 tensor [N].
        classes: class names, indexed by label.
        mean, std: per-channel statistics of the dataset in [0, 1] units, used by `to_model_input`.
            The same for every split (never measured on val or test).

    Example:
        >>> splits = labkit.data.load_splits("shapes10", 512, 128, 256)
        >>> splits["train"].images.shape, splits["train"].num_classes
        (torch.Size([512, 3, 32, 32]), 10)
    """

    name: str
    split: str
    images: torch.Tensor = field(repr=False)
    labels: torch.Tensor = field(repr=False)
    classes: list[str] = field(repr=False)
    mean: tuple[float, float, float] = field(repr=False)
    std: tuple[float, float, float] = field(repr=False)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __repr__(self) -> str:
        return (f"ImageData(name={self.name!r}, split={self.split!r}, num_samples={len(self)}, "
                f"num_classes={self.num_classes})")


def load_splits(name: str, train_size: int, val_size: int, test_size: int, seed: int = 0,
                root: str | Path | None = None, download: bool = True) -> dict[str, ImageData]:
    """Load the ``train``, ``val`` and ``test`` splits of dataset ``name``; the three never share a sample.

    Args:
        name: one of `available()`.
        train_size: samples in the training split (the profile's size, usually).
        val_size: samples in the validation split.
        test_size: samples in the test split.
        seed: which samples (generated datasets) or which permutation (CIFAR-10).
        root: CIFAR-10 only: the folder holding ``cifar-10-batches-py`` (default `cache_dir()`).
        download: CIFAR-10 only: download it when it is not in ``root``.

    Example:
        >>> splits = labkit.data.load_splits("shapes10", train_size=2048, val_size=512, test_size=512)
        >>> len(splits["val"])
        512
    """
    if name not in available():
        raise ConfigError("dataset", name, f"one of {available()}")
    sizes = {"train": train_size, "val": val_size, "test": test_size}
    for split, size in sizes.items():
        if not is_int(size) or size < 1:
            raise ConfigError(f"{split}_size", size, "a positive integer (1, 2, 3, ...)")
    if not is_int(seed) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    if name == "cifar10":
        return _load_cifar10(sizes, seed, Path(root) if root is not None else cache_dir(), download)
    mean, std = _shapes_stats(name)
    classes = list(_SHAPES[name])
    splits = {}
    for split, size in sizes.items():
        images, labels = _shapes_split(name, split, size, seed)
        splits[split] = ImageData(name, split, images, labels, classes, mean, std)
    return splits


# --- generated shapes -----------------------------------------------------------------------------


def _split_rng(name: str, split: str, seed: int) -> np.random.Generator:
    # crc32, not hash(): Python salts str hashes per process, and the bytes must not change between runs.
    entropy = [zlib.crc32(name.encode()), zlib.crc32(split.encode()), seed]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


@functools.lru_cache(maxsize=6)
def _shapes_split(name: str, split: str, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached: a sweep calls load_splits once per run with the same arguments.
    return render_shapes(name, size, _split_rng(name, split, seed))


def render_shapes(name: str, num_images: int, rng: np.random.Generator,
                  style: ShapesStyle = SHAPES_STYLE) -> tuple[torch.Tensor, torch.Tensor]:
    """Render ``num_images`` images of the generated dataset ``name``, classes balanced to within one.

    Args:
        name: ``shapes10`` or ``shapes_source``.
        num_images: how many.
        rng: the numpy random generator that decides everything (same state -> same bytes).
        style: the difficulty knobs, `SHAPES_STYLE` by default.

    Returns:
        (images uint8 [N, 3, 32, 32], labels int64 [N]).

    Example:
        >>> images, labels = render_shapes("shapes10", 16, np.random.default_rng(0))
    """
    if name not in _SHAPES:
        raise ConfigError("dataset", name, f"one of {sorted(_SHAPES)}")
    sdfs = list(_SHAPES[name].values())
    n = num_images
    labels = rng.permutation(np.arange(n) % len(sdfs))
    radius = rng.uniform(*style.radius_px, size=n).astype(np.float32)
    angle = np.radians(rng.uniform(-style.rotation_deg, style.rotation_deg, size=n)).astype(np.float32)
    low = style.centre_margin * radius
    high = (IMAGE_SHAPE[-1] - 1) - low
    centre_x = (low + (high - low) * rng.uniform(size=n)).astype(np.float32)
    centre_y = (low + (high - low) * rng.uniform(size=n)).astype(np.float32)
    background = rng.uniform(size=(n, 3)).astype(np.float32)
    foreground = rng.uniform(size=(n, 3)).astype(np.float32)
    # Colour is independent of the class; only too-similar brightness is redrawn, so the shape stays visible.
    low_contrast = np.abs((foreground - background) @ _LUMA) < style.min_contrast
    while low_contrast.any():
        foreground[low_contrast] = rng.uniform(size=(int(low_contrast.sum()), 3))
        low_contrast = np.abs((foreground - background) @ _LUMA) < style.min_contrast
    light_angle = rng.uniform(0, 2 * np.pi, size=n).astype(np.float32)
    light_amplitude = rng.uniform(0, style.gradient_amplitude, size=n).astype(np.float32)

    side = IMAGE_SHAPE[-1]
    ys, xs = np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32), indexing="ij")
    images = np.empty((n, *IMAGE_SHAPE), dtype=np.uint8)
    for start in range(0, n, _GENERATE_CHUNK):
        sl = slice(start, min(start + _GENERATE_CHUNK, n))
        r = radius[sl, None, None]
        dx = (xs - centre_x[sl, None, None]) / r
        dy = (ys - centre_y[sl, None, None]) / r
        cos, sin = np.cos(angle[sl, None, None]), np.sin(angle[sl, None, None])
        u, v = cos * dx + sin * dy, -sin * dx + cos * dy
        sdf = np.empty_like(u)
        chunk_labels = labels[sl]
        for k, shape_sdf in enumerate(sdfs):
            mask = chunk_labels == k
            if mask.any():
                sdf[mask] = shape_sdf(u[mask], v[mask])
        alpha = np.clip(0.5 - sdf * r / style.edge_softness_px, 0.0, 1.0)[:, None]
        light = light_amplitude[sl, None, None] * (
            ((xs - side / 2) * np.cos(light_angle[sl, None, None])
             + (ys - side / 2) * np.sin(light_angle[sl, None, None])) / (side / 2))
        image = background[sl, :, None, None] * (1 - alpha) + foreground[sl, :, None, None] * alpha
        image += light[:, None]
        image += style.noise_std * rng.standard_normal(size=image.shape, dtype=np.float32)
        images[sl] = np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


@functools.cache
def _shapes_stats(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    # Measured once on a fixed reference sample (not on the caller's splits), so train, val and test are
    # normalised alike and the numbers follow SHAPES_STYLE when it is tuned.
    images, _ = render_shapes(name, 2048, _split_rng(name, "stats", 0))
    pixels = images.permute(1, 0, 2, 3).reshape(3, -1).double() / 255.0
    mean = tuple(round(float(m), 4) for m in pixels.mean(dim=1))
    std = tuple(round(float(s), 4) for s in pixels.std(dim=1))
    return mean, std


# --- CIFAR-10 -------------------------------------------------------------------------------------

def _load_cifar10(sizes: dict, seed: int, root: Path, download: bool) -> dict[str, ImageData]:
    download = download and is_online()  # $LABKIT_OFFLINE: use what is on disk, never try the network
    train_images, train_labels, classes = _cifar10_arrays(str(root), True, download)
    num_train = len(train_labels)
    if sizes["train"] + sizes["val"] > num_train:
        raise ConfigError("train_size", sizes["train"],
                          f"at most {num_train - sizes['val']} with val_size={sizes['val']} "
                          f"(train and val are drawn from the {num_train} CIFAR-10 training images)")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_train, generator=generator)
    picks = {"train": order[:sizes["train"]], "val": order[sizes["train"]:sizes["train"] + sizes["val"]]}
    splits = {split: ImageData("cifar10", split, train_images[idx], train_labels[idx], classes,
                               CIFAR10_MEAN, CIFAR10_STD)
              for split, idx in picks.items()}
    test_images, test_labels, _ = _cifar10_arrays(str(root), False, download)
    if sizes["test"] > len(test_labels):
        raise ConfigError("test_size", sizes["test"],
                          f"at most {len(test_labels)} (the number of CIFAR-10 test images)")
    splits["test"] = ImageData("cifar10", "test", test_images[:sizes["test"]], test_labels[:sizes["test"]],
                               classes, CIFAR10_MEAN, CIFAR10_STD)
    return splits


def download_once(name: str, root: str | Path | None = None) -> None:
    """Download dataset ``name`` now when it needs the network and is not on disk, so that processes started after
    this call (a DDP job's ranks) find it there, instead of each downloading the same archive into the same folder
    at once. Generated datasets need nothing; offline (``$LABKIT_OFFLINE``) it does nothing, and each process says
    why it cannot load the data.

    Args:
        name: a dataset of `available`. root: where CIFAR-10 goes (default `cache_dir`).
    """
    if on_disk(name, root) or not is_online():
        return
    _cifar10_arrays(str(Path(root) if root is not None else cache_dir()), True, True)


@functools.lru_cache(maxsize=2)
def _cifar10_arrays(root: str, train: bool, download: bool) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    import torchvision

    try:
        with download_timeout():
            dataset = torchvision.datasets.CIFAR10(root=root, train=train, download=download)
    except Exception as exc:  # network errors, timeouts, a corrupt archive, or missing files
        how = (f"could not be downloaded ({type(exc).__name__}: {exc})" if download
               else "is not on disk and downloading is off (download=False, or $LABKIT_OFFLINE is set)")
        raise DatasetUnavailableError(
            f"CIFAR-10 {how}. labkit looked in {root}. No network? Download {CIFAR10_URL} elsewhere and put "
            f"the extracted 'cifar-10-batches-py' folder in {root} (or point ${DATA_DIR_ENV} at the folder "
            "that holds it), or use dataset='shapes10', which labkit generates offline."
        ) from exc
    images = torch.from_numpy(np.ascontiguousarray(dataset.data.transpose(0, 3, 1, 2)))  # NHWC -> NCHW
    labels = torch.as_tensor(dataset.targets, dtype=torch.int64)
    return images, labels, list(dataset.classes)


# --- loaders --------------------------------------------------------------------------------------


class _BatchIndexed(Dataset):
    """Indexed by a list of indices: one vectorised gather per batch instead of one call per sample."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, indices):
        index = torch.as_tensor(indices, dtype=torch.int64)
        return self.images[index], self.labels[index]


def make_loader(data: ImageData, batch_size: int, shuffle: bool, seed: int = 0, drop_last: bool = False,
                sampler=None, pin_memory: bool = False) -> DataLoader:
    """A DataLoader over ``data`` yielding (uint8 images [B, 3, 32, 32], int64 labels [B]).

    Args:
        data: one split from `load_splits`.
        batch_size: samples per batch.
        shuffle: random order (seeded) or the stored order.
        seed: seeds the shuffle.
        drop_last: drop a last, smaller batch.
        sampler: indices to use instead, ignoring ``shuffle``/``seed`` (a ``DistributedSampler``: call ``set_epoch``).
        pin_memory: pin the batches for faster, asynchronous copies to the GPU (ignored without CUDA).

    Example:
        >>> loader = make_loader(splits["train"], batch_size=64, shuffle=True, seed=0)
        >>> images, labels = next(iter(loader))
    """
    if not is_int(batch_size) or batch_size < 1:
        raise ConfigError("batch_size", batch_size, "a positive integer (1, 2, 3, ...)")
    dataset = _BatchIndexed(data.images, data.labels)
    if sampler is None:
        if shuffle:
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
        else:
            sampler = SequentialSampler(dataset)
    batches = BatchSampler(sampler, batch_size, drop_last)
    return DataLoader(dataset, batch_size=None, sampler=batches, num_workers=0,
                      pin_memory=bool(pin_memory and torch.cuda.is_available()))


@functools.lru_cache(maxsize=16)
def _normalisation(mean: tuple, std: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32).view(1, 3, 1, 1)
    shift = torch.tensor([m / s for m, s in zip(mean, std, strict=True)], dtype=torch.float32).view(1, 3, 1, 1)
    return scale.to(device), shift.to(device)


def to_model_input(images: torch.Tensor, data: ImageData, device, channels_last: bool = False,
                   size: int | None = None) -> torch.Tensor:
    """uint8 images -> float32, scaled to [0, 1] and normalised by ``data.mean``/``data.std``, on ``device``.

    Args:
        images: uint8 [B, 3, H, W], as the loader yields them.
        data: the split they came from (for mean and std).
        device: where the model runs (``torch.device`` or a string like ``"cuda"``).
        channels_last: return the channels_last memory format (faster convolutions with tensor cores).
        size: resize to ``size`` x ``size`` on the device (bilinear), e.g. 32 -> 128; None: as they are.

    Example:
        >>> x = to_model_input(images, splits["train"], "cpu")
        >>> x.dtype, x.shape
        (torch.float32, torch.Size([64, 3, 32, 32]))
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ConfigError("images", f"{images.dtype} {list(images.shape)}", "a uint8 tensor [B, 3, H, W]")
    device = torch.device(device)
    scale, shift = _normalisation(tuple(data.mean), tuple(data.std), device)
    x = images.to(device, non_blocking=True).float().mul_(scale).sub_(shift)
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x
