"""Where a probe runs on the simulator, in this process: the simulated executor and a request's
workload as the simulated GPU runs it."""
