"""The gates a probe passes before it may run on a GPU: idle (is the GPU someone else's, busy or
allocated) and admission (does its child fit in the host's memory)."""
