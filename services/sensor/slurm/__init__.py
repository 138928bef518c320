"""Slurm backend: ``squeue --json``/``sinfo --json`` in, ``scontrol`` out."""
