"""Plain data and pure rules that both sides of the probe boundary share.

What to run (``spec``), what comes back (``result``, one ``WindowStats`` per measured window),
the run record (``record``), the JSON wire format (``wire``), settle-by-measurement (``settle``) and
the recommendation rule (``recommend``). Standard library only; imports neither side.
"""
