"""``optimizer_impl``: torch.optim's for-loop, foreach and fused kernels take the same AdamW/SGD step."""

import pytest
import torch

from labkit.errors import ConfigError
from labkit.techniques.optimizers import build_optimizer, impl_kwargs


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_the_three_kernels_take_the_same_step(name):
    weights = []
    for impl in (None, "forloop", "foreach", "fused"):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        optimizer = build_optimizer(model, name, lr=0.1, impl=impl)
        model(torch.randn(16, 8)).pow(2).mean().backward()
        optimizer.step()
        weights.append(model.weight.detach().clone())
    for w in weights[1:]:
        assert torch.allclose(w, weights[0], atol=1e-6)


def test_impl_keywords_and_refusals():
    assert impl_kwargs(None) == {} and impl_kwargs("fused") == {"fused": True}
    with pytest.raises(ConfigError, match=r"optimizer_impl='cuda'.*\['forloop', 'foreach', 'fused'\]"):
        impl_kwargs("cuda")
    with pytest.raises(ConfigError, match=r"optimizer_impl='fused'.*None with optimizer='adamw8bit'"):
        build_optimizer(torch.nn.Linear(2, 2), "adamw8bit", impl="fused")
