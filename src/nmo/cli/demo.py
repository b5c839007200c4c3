"""``nmo demo``: placeholder replaced below."""
