"""Notebook 00 (start here): how labkit measures time, memory and FLOP/s, and a run's numbers in words."""

from .experiments import activation_share, flops_against_peaks, from_scratch, headline, memory, timing_demo

__all__ = ["activation_share", "flops_against_peaks", "from_scratch", "headline", "memory", "timing_demo"]
