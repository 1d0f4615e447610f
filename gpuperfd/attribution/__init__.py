"""Who is on each GPU: Kubernetes pods (the kubelet's PodResources API) and host processes (with
their user, systemd unit and Slurm job). Read in the background; the telemetry flow publishes it
(the ``allocation`` and ``processes`` collectors) and the probing flow's gate refuses allocated GPUs.
"""
