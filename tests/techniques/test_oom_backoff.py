"""labkit.techniques.oom_backoff: the search, with a faked out-of-memory error.

This follows accelerate's test_memory_utils pattern.
"""


import pytest
import torch

from labkit.errors import ConfigError
from labkit.techniques import oom_backoff
from labkit.techniques.oom_backoff import search_batch_size

CUDA_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def oom_above(largest: int, error: Exception = CUDA_OOM):
    def fits(batch_size):
        if batch_size > largest:
            raise error
        return True

    return fits


@pytest.fixture
def freed(monkeypatch):
    """Count the frees after out-of-memory errors (and skip the slow gc.collect they run)."""
    calls = []
    monkeypatch.setattr(oom_backoff, "free_memory", lambda: calls.append(True))
    return calls


def sizes(search):
    return [p.batch_size for p in search.tried]


def test_search_doubles_then_bisects_to_the_exact_largest_size(freed):
    search = search_batch_size(oom_above(100), start=8, limit=1024)
    assert sizes(search) == [8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]
    assert [p.fits for p in search.tried] == [True] * 4 + [False, True, False, False, True, False, False]
    assert search.best == 100 and not search.hit_limit
    assert all(p.peak_bytes is None for p in search.tried) and len(freed) == 5


def test_search_backs_off_on_a_runtime_error_saying_out_of_memory(freed):
    search = search_batch_size(oom_above(40, RuntimeError("CUDA out of memory. Tried to allocate 20 MiB")), start=32)
    assert sizes(search) == [32, 64, 48, 40, 44, 42, 41] and search.best == 40
    assert len(freed) == sum(not p.fits for p in search.tried) == 5


def test_search_when_start_fails_bisects_down_from_zero(freed):
    search = search_batch_size(oom_above(5), start=64)
    assert sizes(search) == [64, 32, 16, 8, 4, 6, 5] and search.best == 5


def test_search_stops_at_the_limit_and_says_so():
    search = search_batch_size(lambda b: True, start=8, limit=50)
    assert sizes(search) == [8, 16, 32, 50] and search.best == 50 and search.hit_limit


def test_search_never_tries_below_the_minimum_and_reports_none_fits():
    search = search_batch_size(lambda b: False, start=8, minimum=2)
    assert sizes(search) == [8, 4, 2] and search.best == 0


def test_search_records_measured_peaks_and_frames_them():
    search = search_batch_size(lambda b: (b * 10 <= 250, b * 10), start=16, limit=64)
    assert search.tried == [(16, True, 160), (32, False, 320), (24, True, 240), (28, False, 280), (26, False, 260),
                            (25, True, 250)]
    assert search.best == 25
    frame = search.to_frame()
    assert list(frame.columns) == ["step", "batch_size", "fits", "peak_bytes"]
    assert frame.step.tolist() == [1, 2, 3, 4, 5, 6]


def test_other_errors_propagate():
    def fits(batch_size):
        if batch_size > 16:
            raise ValueError("Expected more than 1 value per channel")
        return True

    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        search_batch_size(fits, start=8)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        search_batch_size(lambda b: (_ for _ in ()).throw(RuntimeError("shape mismatch")), start=8)


def test_search_rejects_bad_arguments():
    with pytest.raises(ConfigError, match=r"start=1 is not allowed: an integer >= 2"):
        search_batch_size(lambda b: True, start=1, minimum=2)
    with pytest.raises(ConfigError, match=r"limit=4 is not allowed: an integer >= 8"):
        search_batch_size(lambda b: True, start=8, limit=4)
    with pytest.raises(ConfigError, match=r"fits=3 is not allowed: a function"):
        search_batch_size(3)


def test_out_of_memory_recognition():
    assert oom_backoff.is_out_of_memory(torch.OutOfMemoryError("x"))
    assert oom_backoff.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"))
    assert oom_backoff.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to ..."))
    assert not oom_backoff.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not oom_backoff.is_out_of_memory(ValueError("out of memory"))


@pytest.mark.parametrize("message", [
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
    "Expected canUse32BitIndexMath(input) && canUse32BitIndexMath(output) to be true, but got false.",
    "CUDA error: invalid configuration argument",
])
def test_a_library_size_limit_on_a_large_gpu_backs_off_like_out_of_memory(message):
    assert oom_backoff.is_out_of_memory(RuntimeError(message))

    def fits(size):  # an H200 does not run out of memory at 4096 samples; cuBLAS gives up first
        if size > 1000:
            raise RuntimeError(message)
        return True

    assert search_batch_size(fits, start=256, limit=4096).best == 1000


def test_index_safe_limit_keeps_the_largest_activation_within_32_bit_indexing():
    from labkit.techniques.oom_backoff import INDEX_LIMIT_ELEMENTS, index_safe_limit

    assert index_safe_limit(802_816) == 2674  # a ResNet-18's first convolution at 224 x 224
    assert 2674 * 802_816 <= INDEX_LIMIT_ELEMENTS < 2675 * 802_816
    assert index_safe_limit(802_816, grad_accum=4) == 4 * 2674  # per micro-batch
    with pytest.raises(ConfigError, match="elements_per_sample.*0"):
        index_safe_limit(0)


def test_largest_activation_is_counted_per_sample():
    import torchvision

    from labkit.techniques.oom_backoff import largest_activation_elements

    resnet = torchvision.models.resnet18(num_classes=10).eval()
    assert largest_activation_elements(resnet, torch.zeros(2, 3, 224, 224)) == 64 * 112 * 112
    assert largest_activation_elements(torch.nn.Linear(3, 5), torch.zeros(4, 3)) == 5
