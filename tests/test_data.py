"""labkit.data: generated datasets, CIFAR-10 from disk, loaders and input normalisation (CPU, no network)."""

import hashlib
import itertools
import pickle

import numpy as np
import pytest
import torch
import torchvision
from torch import nn
from torch.utils.data import DistributedSampler

from labkit import data
from labkit.errors import ConfigError, DatasetUnavailableError

SHAPES10_CLASSES = ["circle", "square", "triangle", "ring", "hollow_square", "plus", "x_cross",
                    "horizontal_bar", "vertical_bar", "diamond"]


@pytest.fixture(scope="module")
def shapes():
    return data.load_splits("shapes10", 512, 128, 256, seed=0)


def test_available_names():
    assert data.available() == ["cifar10", "shapes10", "shapes_source"]


def test_cache_dir_follows_the_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA_DIR", str(tmp_path / "datasets"))
    assert data.cache_dir() == tmp_path / "datasets"
    assert (tmp_path / "datasets").is_dir()


def test_splits_have_the_asked_sizes_shapes_and_dtypes(shapes):
    assert sorted(shapes) == ["test", "train", "val"]
    for split, size in [("train", 512), ("val", 128), ("test", 256)]:
        d = shapes[split]
        assert (d.name, d.split, len(d)) == ("shapes10", split, size)
        assert d.images.shape == (size, 3, 32, 32) and d.images.dtype == torch.uint8
        assert d.labels.shape == (size,) and d.labels.dtype == torch.int64
        assert 0 <= int(d.labels.min()) and int(d.labels.max()) == 9
        assert d.classes == SHAPES10_CLASSES and d.num_classes == 10
    assert repr(shapes["val"]) == "ImageData(name='shapes10', split='val', num_samples=128, num_classes=10)"


def test_source_task_has_other_classes():
    source = data.load_splits("shapes_source", 20, 10, 10)["train"]
    assert source.num_classes == 10
    assert not set(source.classes) & set(SHAPES10_CLASSES)


def test_same_arguments_give_identical_bytes_and_another_seed_differs(shapes):
    again = data.render_shapes("shapes10", 512, data._split_rng("shapes10", "train", 0))  # bypasses the cache
    assert torch.equal(again[0], shapes["train"].images) and torch.equal(again[1], shapes["train"].labels)
    other = data.load_splits("shapes10", 512, 128, 256, seed=1)
    assert not torch.equal(other["train"].images, shapes["train"].images)
    source = data.load_splits("shapes_source", 512, 128, 256, seed=0)
    assert not torch.equal(source["train"].images, shapes["train"].images)


@pytest.mark.parametrize("name", ["shapes10", "shapes_source"])
def test_splits_share_no_image(name):
    splits = data.load_splits(name, 600, 300, 300, seed=3)
    seen = {split: {bytes(img.numpy()) for img in d.images} for split, d in splits.items()}
    assert [len(s) for s in seen.values()] == [600, 300, 300]  # no duplicate inside a split either
    assert not seen["train"] & seen["val"] and not seen["train"] & seen["test"] and not seen["val"] & seen["test"]


def test_classes_are_balanced(shapes):
    counts = torch.bincount(shapes["train"].labels, minlength=10)
    assert counts.min() >= 51 and counts.max() <= 52  # 512 = 10 * 51 + 2


def test_colour_does_not_predict_the_class():
    # Mean colour per class stays close to the overall mean: the class is in the shape, not the colour.
    train = data.load_splits("shapes10", 3000, 10, 10, seed=0)["train"]
    images = train.images.float() / 255
    per_class = torch.stack([images[train.labels == k].mean(dim=(0, 2, 3)) for k in range(10)])
    assert (per_class - images.mean(dim=(0, 2, 3))).abs().max() < 0.06  # 0.02-0.04 over seeds 0-4


def test_shapes10_is_learnable_by_a_tiny_cnn():
    torch.manual_seed(0)
    splits = data.load_splits("shapes10", 2048, 16, 512, seed=0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    loader = data.make_loader(splits["train"], 64, shuffle=True, seed=0)
    batches = itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader, 4)), 100)
    for images, labels in batches:
        loss = nn.functional.cross_entropy(model(data.to_model_input(images, splits["train"], "cpu")), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        logits = model(data.to_model_input(splits["test"].images, splits["test"], "cpu"))
    accuracy = (logits.argmax(1) == splits["test"].labels).float().mean().item()
    assert accuracy > 0.35  # chance is 0.10; about 0.6 after these 100 steps


def test_loader_batches_cover_the_split_in_order_without_shuffle(shapes):
    loader = data.make_loader(shapes["val"], batch_size=50, shuffle=False)
    batches = list(loader)
    assert len(loader) == 3 and [len(y) for _, y in batches] == [50, 50, 28]
    images, labels = batches[0]
    assert images.dtype == torch.uint8 and images.shape == (50, 3, 32, 32) and labels.dtype == torch.int64
    assert torch.equal(torch.cat([x for x, _ in batches]), shapes["val"].images)
    assert [len(y) for _, y in data.make_loader(shapes["val"], 50, shuffle=False, drop_last=True)] == [50, 50]


def test_loader_order_is_seeded(shapes):
    def order(seed, passes=1):
        loader = data.make_loader(shapes["val"], batch_size=32, shuffle=True, seed=seed)
        return [torch.cat([y for _, y in loader]) for _ in range(passes)]

    first, second = order(0, passes=2)
    assert torch.equal(first, order(0)[0])
    assert not torch.equal(first, order(1)[0])
    assert not torch.equal(first, second)  # a new pass draws a new order
    assert torch.equal(first.sort().values, shapes["val"].labels.sort().values)  # every sample exactly once


def test_loader_uses_a_given_sampler(shapes):
    sampler = DistributedSampler(range(len(shapes["val"])), num_replicas=2, rank=1, shuffle=False)
    labels = torch.cat([y for _, y in data.make_loader(shapes["val"], 16, shuffle=True, sampler=sampler)])
    assert torch.equal(labels, shapes["val"].labels[1::2])


def test_loader_rejects_a_bad_batch_size(shapes):
    with pytest.raises(ConfigError, match=r"batch_size=0 is not allowed: a positive integer"):
        data.make_loader(shapes["val"], batch_size=0, shuffle=False)


def test_to_model_input_normalises_to_mean_0_std_1(shapes):
    x = data.to_model_input(shapes["train"].images, shapes["train"], "cpu")
    assert x.dtype == torch.float32 and x.shape == (512, 3, 32, 32) and x.device.type == "cpu"
    per_channel = x.permute(1, 0, 2, 3).reshape(3, -1)
    assert per_channel.mean(dim=1).abs().max() < 0.05
    assert (per_channel.std(dim=1) - 1).abs().max() < 0.05
    first = shapes["train"].images[0, 0, 0, 0].item()
    assert x[0, 0, 0, 0].item() == pytest.approx((first / 255 - shapes["train"].mean[0]) / shapes["train"].std[0],
                                                  abs=1e-5)


def test_to_model_input_channels_last_and_bad_input(shapes):
    x = data.to_model_input(shapes["val"].images[:4], shapes["val"], torch.device("cpu"), channels_last=True)
    assert x.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ConfigError, match=r"images=.* a uint8 tensor \[B, 3, H, W\]"):
        data.to_model_input(shapes["val"].images.float(), shapes["val"], "cpu")


def test_unknown_dataset_name():
    with pytest.raises(ConfigError, match=r"dataset='mnist' is not allowed: one of \['cifar10', 'shapes10'"):
        data.load_splits("mnist", 10, 10, 10)


@pytest.mark.parametrize("sizes, field", [((0, 10, 10), "train_size=0"), ((10, -1, 10), "val_size=-1"),
                                          ((10, 10, 2.5), "test_size=2.5")])
def test_sizes_must_be_positive_integers(sizes, field):
    with pytest.raises(ConfigError, match=f"{field} is not allowed: a positive integer"):
        data.load_splits("shapes10", *sizes)


# --- CIFAR-10 from a tiny folder in the real on-disk format -----------------------------------------

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _py2_pickle(obj: dict, path):
    # The real batches were pickled by Python 2, whose str keys load as b"data" with encoding="bytes"
    # (and as "data" with the encoding="latin1" torchvision uses). Rewrite the keys to Python 2 strings.
    raw = pickle.dumps(obj, protocol=2)
    for key in obj:
        encoded = key.encode()
        raw = raw.replace(b"X" + len(encoded).to_bytes(4, "little") + encoded,
                          b"U" + len(encoded).to_bytes(1, "little") + encoded, 1)
    path.write_bytes(raw)


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _write_cifar(root, per_batch=12, num_test=10):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    start = 0
    for file in files:
        n = num_test if file == "test_batch" else per_batch
        index = np.arange(start, start + n)
        rows = np.zeros((n, 3072), dtype=np.uint8)
        # Sample i: red = i, green = 100 + i, blue is a gradient along x; labels = i % 10.
        rows[:, :1024] = index[:, None] % 256
        rows[:, 1024:2048] = (100 + index[:, None]) % 256
        rows[:, 2048:] = np.tile(np.repeat(np.arange(32, dtype=np.uint8)[None], 32, 0).reshape(-1), (n, 1))
        _py2_pickle({"batch_label": file, "labels": [int(i) % 10 for i in index], "data": rows,
                     "filenames": [f"{i}.png" for i in index]}, folder / file)
        start += n
    _py2_pickle({"label_names": CIFAR_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072},
                folder / "batches.meta")
    return folder


def test_cifar10_loads_from_disk_in_the_real_format(tmp_path, monkeypatch):
    folder = _write_cifar(tmp_path)
    with open(folder / "data_batch_1", "rb") as f:
        assert b"data" in pickle.load(f, encoding="bytes")  # the fixture matches the real files' keys
    # torchvision checks each file's md5 (the batches and batches.meta): point it at the fixture's files.
    cifar = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cifar, "train_list", [[f, _md5(folder / f)] for f, _ in cifar.train_list])
    monkeypatch.setattr(cifar, "test_list", [[f, _md5(folder / f)] for f, _ in cifar.test_list])
    monkeypatch.setattr(cifar, "meta", {**cifar.meta, "md5": _md5(folder / cifar.meta["filename"])})
    splits = data.load_splits("cifar10", 40, 15, 8, seed=0, root=tmp_path, download=False)
    train, val, test = splits["train"], splits["val"], splits["test"]
    assert (len(train), len(val), len(test)) == (40, 15, 8)
    assert train.images.dtype == torch.uint8 and train.images.shape == (40, 3, 32, 32)
    assert train.classes == CIFAR_CLASSES and train.mean == data.CIFAR10_MEAN and train.std == data.CIFAR10_STD
    # NCHW layout: channel 0 holds the sample index, channel 2 a gradient along x.
    sample = train.images[:, 0, 0, 0].long()
    assert torch.equal(train.images[:, 1, 5, 7].long(), sample + 100)
    assert torch.equal(train.images[3, 2, 9], torch.arange(32, dtype=torch.uint8))
    assert torch.equal(train.labels, sample % 10)
    assert not set(sample.tolist()) & set(val.images[:, 0, 0, 0].tolist())  # train and val disjoint
    assert torch.equal(test.images[:, 0, 0, 0].long(), torch.arange(60, 68))  # the first test images
    again = data.load_splits("cifar10", 40, 15, 8, seed=0, root=tmp_path, download=False)
    assert torch.equal(again["train"].images, train.images)
    other = data.load_splits("cifar10", 40, 15, 8, seed=1, root=tmp_path, download=False)
    assert not torch.equal(other["train"].labels, train.labels)
    with pytest.raises(ConfigError, match=r"train_size=50 is not allowed: at most 45 with val_size=15"):
        data.load_splits("cifar10", 50, 15, 8, root=tmp_path, download=False)
    with pytest.raises(ConfigError, match=r"test_size=11 is not allowed: at most 10"):
        data.load_splits("cifar10", 40, 15, 11, root=tmp_path, download=False)


def test_cifar10_missing_without_download_says_what_to_do(tmp_path):
    with pytest.raises(DatasetUnavailableError, match=r"download=False.*cifar-10-batches-py.*shapes10"):
        data.load_splits("cifar10", 10, 10, 10, root=tmp_path / "empty", download=False)


def test_cifar10_offline_never_tries_the_network(tmp_path, monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("labkit tried the network while $LABKIT_OFFLINE is set")

    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(DatasetUnavailableError, match=r"LABKIT_OFFLINE is set.*shapes10"):
        data.load_splits("cifar10", 10, 10, 10, root=tmp_path / "offline", download=True)


def test_to_model_input_resizes_on_the_device(shapes):
    split = shapes["train"]
    x = data.to_model_input(split.images[:4], split, "cpu", size=64)
    assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float32
    assert data.to_model_input(split.images[:4], split, "cpu").shape == (4, 3, 32, 32)
    # bilinear: a constant image stays constant
    flat = torch.full((1, 3, 32, 32), 128, dtype=torch.uint8)
    up = data.to_model_input(flat, split, "cpu", size=48)
    assert torch.allclose(up, up[..., :1, :1].expand_as(up))


def test_download_once_fetches_cifar10_before_processes_start_and_never_twice(tmp_path, monkeypatch):
    # 07 at `full` on 2 x T4: both ranks found no CIFAR-10 and downloaded the same archive into the same folder
    calls = []

    class FakeCIFAR10:
        def __init__(self, root, train, download):
            calls.append(download)
            _write_cifar(type(tmp_path)(root))
            self.data, self.targets, self.classes = np.zeros((1, 32, 32, 3), np.uint8), [0], CIFAR_CLASSES

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    data._cifar10_arrays.cache_clear()
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    data.download_once("cifar10", root=tmp_path)
    assert calls == []  # offline: nothing tried; each process then says why it has no data
    monkeypatch.setenv("LABKIT_OFFLINE", "0")
    data.download_once("cifar10", root=tmp_path)
    data.download_once("cifar10", root=tmp_path)  # on disk now
    data.download_once("shapes10", root=tmp_path)  # generated
    assert calls == [True] and data.on_disk("cifar10", tmp_path)
    data._cifar10_arrays.cache_clear()
