"""Measuring a policy: pass rates sampled over all ranks (the pools' measurement, judging a
model), the pass-rate evaluation and checkpoint-selection callbacks, and the final keep rule.

The stages and the callbacks both measure through here, so their numbers agree and neither
imports the other.
"""
