"""Typed clients, one per service. They take and return ``libra.types`` values and raise
``libra.errors`` classes; generated messages never leak past them."""
