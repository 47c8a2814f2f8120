"""labkit.techniques.accumulation: no gradient sync on all but the last micro-batch."""

import contextlib

import torch

from labkit.techniques import accumulation


class FakeDDP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.entered = []

    @contextlib.contextmanager
    def no_sync(self):
        self.entered.append(True)
        yield


def test_sync_context_skips_sync_on_all_but_the_last_micro_batch():
    model = FakeDDP()
    for index in range(4):
        with accumulation.sync_context(model, last_micro_batch=index == 3):
            pass
    assert model.entered == [True, True, True]
    plain = torch.nn.Linear(2, 2)
    assert isinstance(accumulation.sync_context(plain, last_micro_batch=False), contextlib.nullcontext)
