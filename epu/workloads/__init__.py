"""Workloads for ``epu simulate`` and the simulated batch backend: traces and generators."""
