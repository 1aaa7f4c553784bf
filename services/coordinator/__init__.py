"""Coordinator: control plane (public job API, worker registry and leases)."""
