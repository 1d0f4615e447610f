"""The node probe (interconnect): one run over a set of GPUs. Its executors (real workers or
simulated), the daemon's schedule, its series and `gpuperfd probe interconnect`."""
