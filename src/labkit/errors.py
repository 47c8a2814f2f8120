"""Errors labkit raises for bad input: each names the field, the bad value and what is allowed."""

from __future__ import annotations


class LabkitError(Exception):
    """Base class of labkit's own errors."""


class ConfigError(LabkitError, ValueError):
    """A configuration value is not allowed."""

    def __init__(self, field: str, value, allowed: str, hint: str = ""):
        self.field, self.value, self.allowed = field, value, allowed
        message = f"{field}={value!r} is not allowed: {allowed}"
        if hint:
            message += f". {hint}"
        super().__init__(message)


class ChecksumError(LabkitError):
    """A file's sha256 does not match the recorded one."""


class NonFiniteLossError(LabkitError, FloatingPointError):
    """The training loss became NaN or infinite."""

    def __init__(self, step: int, loss: float, precision: str):
        self.step, self.loss = step, loss
        remedies = "lower the learning rate (lr), set grad_clip (e.g. 1.0)"
        if precision == "fp16":
            remedies += ", or use bf16 where it is native (fp16 overflows above 65504)"
        super().__init__(f"the loss became {loss} at step {step} ({precision}); usual remedies: {remedies}")


class DatasetUnavailableError(LabkitError, RuntimeError):
    """A dataset could not be found on disk nor downloaded."""


class UnsupportedError(LabkitError, RuntimeError):
    """What was asked exists, but this device or this installation cannot run it."""

    def __init__(self, field: str, value, reason: str, available: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r} cannot run here: {reason}. What runs here: {available}")


class DistributedError(LabkitError, RuntimeError):
    """A distributed job failed: a rank raised, died or the job hung past its limit."""

    def __init__(self, message: str, rank: int | None = None, exit_code: int | None = None,
                 elapsed_s: float | None = None, log: str = ""):
        self.rank, self.exit_code, self.elapsed_s, self.log = rank, exit_code, elapsed_s, log
        super().__init__(message)
