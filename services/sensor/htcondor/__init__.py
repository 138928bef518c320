"""HTCondor backend through the ``htcondor2``/``classad2`` bindings."""
