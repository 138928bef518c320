"""The deterministic simulator: the real cores in virtual time, with faults and invariants.

One integer seed fixes a whole run. The world (``world``) owns a virtual clock, one event
queue and the seeded random streams; the bus (``bus``) delivers every message with a delay,
duplicate, reordering or loss drawn from them; the batch system (``batch``) and the cloud
(``cloud``) are simulated; the decision engine, the provisioner and the sensor core are the
production classes, driven through their public entry points (``processes``). Faults
(``faults``) are knobs of a scenario (``scenarios``); the invariants (``invariants``) are
checked at every step; ``runner`` runs seeds and ``cli`` is ``epu sim``. docs/simulation.md
explains the model.
"""
