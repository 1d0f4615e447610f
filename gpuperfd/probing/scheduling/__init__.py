"""The daemon's scheduling: when a result is due (APScheduler jobs, freshness, each GPU's
qualifying moment), the round that runs it on a GPU, sweeps taken in parts, the GPU-time share,
and the probe service (gate, one owned sweep, publish)."""
