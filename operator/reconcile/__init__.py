"""Reconcilers, one module per kind. Each reads the cache, decides with corral.operator.planning and writes the
minimum: nothing when the object already looks right."""
