"""The HTTP surface: the server and its routes, the exporter-toolkit web config (TLS, basic auth,
response headers, re-read on change) and the landing page at ``/``."""
