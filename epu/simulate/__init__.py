"""``epu simulate``: replay a workload against the real policies in virtual time (docs/experiments.md)."""
