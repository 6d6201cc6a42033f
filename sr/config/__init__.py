"""Canonical config: schema, load/dump/validate, placement."""
