"""``gpuperfd top``: a live per-GPU view in the terminal, from the daemon's ``/api/v1/gpus`` or a local read."""
