"""The HTTP server stack: listener, TLS, probes, metrics authentication, request limits."""
