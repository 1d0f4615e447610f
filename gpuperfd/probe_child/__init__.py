"""Probing flow, child side: everything that runs inside the probe child process.

The child's entry point (``child.py``), the measurement harness, the timed step loop, the
GPU-busy pass, injected faults and the torch workloads (``workloads/``). It imports
:mod:`gpuperfd.probe_data` (what to run, what comes back) and :mod:`gpuperfd.device` (the
energy counter), never the daemon's side (:mod:`gpuperfd.probing`), telemetry, web or config.
"""
