"""The interconnect probe's workers (issue 44): one process per GPU of the set, started by
``probing/interconnect/runner.py`` by module name (``python -m gpuperfd.probe_child.interconnect.worker``)."""
