"""Device layer: one interface (base), NVML (real) and simulated implementations."""
