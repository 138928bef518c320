"""Torque/PBS backend: ``qstat -f -x``/``pbsnodes -x`` in, ``pbsnodes``/``qmgr`` out (pbs_python when it imports)."""
