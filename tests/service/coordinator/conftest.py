"""The agent endpoint's ``stack`` fixture (agent_stack.py) for the test files that use it."""

from tests.service.coordinator.agent_stack import stack  # noqa: F401 - a fixture
