"""Telemetry flow: device reads in the background sampler -> collectors -> exporter -> exposition text.

Nothing in this package is called by the scrape except ``exporter``/``exposition``, which only format
the latest readings; every device call happens on the sampler's lanes.
"""
