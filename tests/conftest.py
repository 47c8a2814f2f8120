"""Tests run on the CPU with tiny seeded work: the `ci` profile, offline, a private data cache."""

import os
import tempfile

import pytest

os.environ["LABKIT_PROFILE"] = "ci"
os.environ["LABKIT_OFFLINE"] = "1"
os.environ["TQDM_DISABLE"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["LABKIT_DATA_DIR"] = tempfile.mkdtemp(prefix="labkit-test-data-")


@pytest.fixture
def tiny_cfg():
    """A run that takes well under a second on 2 CPU cores."""
    import labkit

    return labkit.RunConfig(model="small_cnn", dataset="shapes10", batch_size=32, max_steps=6, train_size=128,
                            device="cpu")
