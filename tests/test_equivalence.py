"""compare_step: a plain step against Trainer.step, from the same weights on the same batches."""

import pytest
import torch
import torch.nn.functional as F

from labkit.equivalence import compare_step
from labkit.errors import ConfigError
from labkit.exercises import exercise_config
from labkit.labs.mixed_precision.exercises import amp_step_solution


def plain_step(model, images, labels, optimizer):
    F.cross_entropy(model(images), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_the_same_step_is_the_same():
    comparison = compare_step(plain_step, exercise_config(optimizer="sgd"))
    assert comparison.same() and comparison.grad_diff == 0.0 and comparison.engine_steps == comparison.plain_steps == 2


def test_fp16_compares_the_scaler_too():
    comparison = compare_step(amp_step_solution, exercise_config(precision="fp16", grad_clip=1.0))
    assert comparison.same() and comparison.engine_scale == comparison.plain_scale == 2.0**16


def test_a_different_gradient_is_seen():
    def doubled(model, images, labels, optimizer):
        (2 * F.cross_entropy(model(images), labels)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    comparison = compare_step(doubled, exercise_config(optimizer="sgd"), steps=1)
    assert not comparison.same() and comparison.grad_diff == pytest.approx(1.0, rel=1e-4)  # twice the gradient


def test_an_overflowing_scale_makes_the_engine_skip_its_steps():
    comparison = compare_step(amp_step_solution, exercise_config(precision="fp16", grad_clip=1.0), steps=2,
                              init_scale=2.0**40)
    assert comparison.engine_steps == comparison.plain_steps == 0 and comparison.engine_scale == 2.0**38


def test_gradients_left_over_from_the_last_step_are_seen():
    def no_zero_grad(model, images, labels, optimizer):
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    first = compare_step(no_zero_grad, exercise_config(optimizer="sgd"), steps=1)
    assert first.same()  # nothing left over yet
    assert not compare_step(no_zero_grad, exercise_config(optimizer="sgd"), steps=2).same()


def test_a_step_that_never_steps_is_infinitely_far():
    comparison = compare_step(lambda model, images, labels, optimizer: None, exercise_config())
    assert comparison.grad_diff == float("inf") and comparison.plain_steps == 0 and not comparison.same()


def test_bad_input():
    with pytest.raises(ConfigError, match="step=3 is not allowed: a function step"):
        compare_step(3, exercise_config())
    with pytest.raises(ConfigError, match="checkpointing=True is not allowed: False"):
        compare_step(plain_step, exercise_config(checkpointing=True))
    assert torch.backends.cudnn.deterministic is False  # the comparison's setting does not leak
