"""Fakes for the true external edges of the services (see each module's docstring).

Everything else in a test that uses them is real: cores, pure modules, wire codecs and a
real redis-server (``tests/conftest.py``).
"""
