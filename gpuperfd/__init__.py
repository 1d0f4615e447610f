"""gpuperfd: a GPU performance daemon for Prometheus.

Data flow (see docs/architecture.md): device layer -> background sampler ->
collectors (scrape) -> HTTP /metrics; probe runner (child process) -> results
-> probe metrics and history; power-cap sweeps guarded by an on-disk journal.
"""

__version__ = "0.1.0"
