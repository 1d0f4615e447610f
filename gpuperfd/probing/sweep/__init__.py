"""Power-cap sweeps and their safety: the journal, the cap guard, the sweep loop."""
