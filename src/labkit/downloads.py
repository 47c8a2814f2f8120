"""Where labkit's downloads live, and whether a dataset can be had now: on disk, or from a host that answers.

`cache_dir` (``$LABKIT_DATA_DIR``, the checkout's ``data/cache`` or ``~/.cache/labkit/data``), `download_timeout`
for a stalled download, and `fetch_problem`, which `labkit.config.workload` asks before it picks the ``full``
workload: offline (``$LABKIT_OFFLINE``, or a host that does not answer within a few seconds) it falls back.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import urllib.parse
from pathlib import Path

from .env import OFFLINE_ENV, is_online

DATA_DIR_ENV = "LABKIT_DATA_DIR"
DOWNLOAD_TIMEOUT_S = 60.0
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"


def cache_dir() -> Path:
    """Where downloads live, created on demand.

    ``$LABKIT_DATA_DIR`` if set; else ``<repo>/data/cache`` when labkit runs from a checkout that has a
    ``data/`` folder; else ``~/.cache/labkit/data``.

    Example:
        >>> labkit.data.cache_dir()
        PosixPath('/home/me/labkit/data/cache')
    """
    if os.environ.get(DATA_DIR_ENV):
        path = Path(os.environ[DATA_DIR_ENV]).expanduser()
    elif (Path(__file__).resolve().parents[2] / "data").is_dir():
        path = Path(__file__).resolve().parents[2] / "data" / "cache"
    else:
        path = Path.home() / ".cache" / "labkit" / "data"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def download_timeout(seconds: float = DOWNLOAD_TIMEOUT_S):
    """Give up on a stalled download after ``seconds`` instead of hanging the notebook forever.

    Sets the default socket timeout for the ``with`` block (urllib, which torchvision uses, has none).

    Example:
        >>> with download_timeout(60):
        ...     torchvision.datasets.CIFAR10(root, download=True)
    """
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


PROBE_TIMEOUT_S = 3.0  # how long a profile waits for a download host before it takes the offline workload
CIFAR10_FILES = ("data_batch_1", "data_batch_5", "test_batch", "batches.meta")


def on_disk(name: str, root: str | Path | None = None) -> bool:
    """Whether dataset ``name`` can be loaded without the network (generated ones always can).

    Args:
        name: a dataset of `available`. root: where CIFAR-10 would be (default `cache_dir`).
    """
    if name != "cifar10":
        return True
    folder = Path(root if root is not None else cache_dir()) / "cifar-10-batches-py"
    return all((folder / f).is_file() for f in CIFAR10_FILES)


@functools.lru_cache(maxsize=8)
def host_answers(host: str, port: int = 443, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``host`` accepts a TCP connection within ``timeout_s`` (asked once per process).

    Args:
        host: a host name. port: its port. timeout_s: how long to wait.
    """
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:  # no route, refused, a timeout, a name that does not resolve
        return False
    return True


def fetch_problem(name: str, root: str | Path | None = None) -> str | None:
    """Why dataset ``name`` can be neither loaded from disk nor downloaded now; None when it can.

    Args:
        name: a dataset of `available`. root: where CIFAR-10 would be (default `cache_dir`).
    """
    if on_disk(name, root):
        return None
    if not is_online():
        return f"{name} is not on disk and ${OFFLINE_ENV} is set"
    host = urllib.parse.urlparse(CIFAR10_URL).hostname
    if not host_answers(host):
        return (f"{name} is not on disk and its download host ({host}) did not answer within "
                f"{PROBE_TIMEOUT_S:g} s (no internet here?)")
    return None
