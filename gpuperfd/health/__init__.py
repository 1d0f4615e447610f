"""The health stage: readings and probe history -> one verdict per GPU (docs/health.md)."""
