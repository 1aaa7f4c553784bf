"""The gateway's refusals are ``libra.errors`` classes (one hierarchy, one status mapping).

Real: the error classes and ``libra.errors.error_from_status`` (what a gRPC client runs on
the status a server's interceptor set from ``grpc_status_name``).
"""

from __future__ import annotations

import inspect

import pytest

from libra import errors
from services.toolgateway import errors as gateway_errors
from services.toolgateway.errors import ToolBusy, UnknownReward, UnknownTool


def _own_classes() -> list[type]:
    return [cls for _, cls in inspect.getmembers(gateway_errors, inspect.isclass)
            if cls.__module__ == gateway_errors.__name__]


def test_the_names_plugins_import_from_the_gateway_are_libras_classes() -> None:
    # docs/plugins.md told reward authors to raise services.toolgateway.errors.Unavailable.
    for name in ("Unavailable", "Internal", "InvalidArgument", "DeadlineExceeded",
                 "ResourceExhausted"):
        assert getattr(gateway_errors, name) is getattr(errors, name)


def test_every_gateway_error_is_a_libra_error() -> None:
    classes = _own_classes()
    assert {c.__name__ for c in classes} == {"ToolBusy", "UnknownReward", "UnknownTool"}
    assert all(issubclass(c, errors.LibraError) for c in classes)


@pytest.mark.parametrize(("raised", "field"), [
    (UnknownTool("rm", ["search", "calculator"]), "tool"),
    (UnknownReward("vibes", ["exact_match"]), "reward"),
])
def test_an_unknown_name_comes_back_as_invalid_argument_naming_the_field(
        raised: errors.InvalidArgument, field: str) -> None:
    back = errors.error_from_status(raised.grpc_status_name, str(raised))
    assert isinstance(back, errors.InvalidArgument)
    assert (back.field, back.reason) == (field, raised.reason)


def test_unknown_tool_lists_the_registered_names_sorted() -> None:
    err = UnknownTool("rm", ["search", "calculator"])
    assert err.known == ["calculator", "search"]
    assert err.reason == "unknown tool 'rm'; known tools: calculator, search"


def test_a_busy_tool_keeps_its_retry_hint_across_the_status() -> None:
    busy = ToolBusy("tool 'search': 2 running and 4 queued", 250)
    assert busy.retryable and busy.retry_after_ms == 250
    back = errors.error_from_status(busy.grpc_status_name, str(busy))
    assert type(back) is errors.ResourceExhausted and back.retry_after_ms == 250
