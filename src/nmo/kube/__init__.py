"""The API boundary: the only package that talks to the API server (kr8s)."""
