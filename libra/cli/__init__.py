"""The ``libra`` command."""
