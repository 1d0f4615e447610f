"""Applying the recommended power cap (issue 45): opt-in, guarded, checked, rolled back by itself.

``policy`` decides from plain inputs (no device, no I/O); ``controller`` is the daemon's side that
journals the operator's cap, sets the cap, watches it and rolls it back; ``metrics`` publishes what
it did and what it saved (``gpuperfd apply --status/--revert`` is :mod:`gpuperfd.commands.apply`). docs/apply.md.
"""
