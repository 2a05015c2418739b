"""Preflight: everything a run checks before any work, above every room it checks (backends, measurement,
the compile cache, the route policy, the record store), and the sweep's check of each of its jobs."""
