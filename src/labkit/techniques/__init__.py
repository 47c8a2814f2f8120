"""Each technique's mechanism: small functions on a model, optimizer or batch that a learner could copy
into their own training loop. No training loop, no experiments, no prose; nothing above the base layer."""
