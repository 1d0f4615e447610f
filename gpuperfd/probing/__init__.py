"""Probing flow, daemon side: schedules, idle gating, the probe service, executors (child process or
simulated), power-cap sweeps (``sweep/``), the probe series and the history file.

Nothing here imports torch: the workloads run in a child process (:mod:`gpuperfd.probe_child`).
"""
