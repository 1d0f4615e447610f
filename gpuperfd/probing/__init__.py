"""Probing flow, parent side (the daemon or a CLI), one folder per stage of a probe's walk:
``scheduling/`` (when a result is due, the round, the probe service), ``gates/`` (idle, admission),
``sweep/`` (the one owned sweep and the caps' safety), ``executors.py`` (the one choice of where a
probe runs: ``child/`` a probe child process, or ``simulated/``), ``observer.py``, ``metrics.py`` and
``history.py`` (where a result goes); ``interconnect/`` (the node probe) and ``check/`` (``gpuperfd
check``) are flows of their own. The commands that drive them are in :mod:`gpuperfd.commands`.

Nothing here imports torch: the workloads run in a child process (:mod:`gpuperfd.probe_child`).
"""
