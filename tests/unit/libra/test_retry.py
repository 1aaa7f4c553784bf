"""retry_transient: backoff while the error is retryable, up to the policy's budget.

Fakes: ``FakeClock`` + ``FakeSleep`` (tests/fakes/sleep.py) replace wall time and
waiting; the call is a local coroutine that fails as told.
"""

from __future__ import annotations

import pytest

from libra.clock import FakeClock
from libra.errors import DeadlineExceeded, InvalidArgument, LibraError, Unavailable
from libra.retry import RetryPolicy, retry_transient
from tests.fakes.sleep import FakeSleep


class Flaky:
    """Raises the given errors in order, then returns ``"ok"``."""

    def __init__(self, *errors: LibraError) -> None:
        self.errors = list(errors)
        self.num_calls = 0

    async def __call__(self) -> str:
        self.num_calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_retryable_errors_are_retried_with_doubling_capped_backoff() -> None:
    clock = FakeClock()
    sleep = FakeSleep(clock)
    call = Flaky(*[Unavailable("down")] * 6, DeadlineExceeded("slow"))
    policy = RetryPolicy(first_delay_s=0.5, max_delay_s=2.0)
    assert await retry_transient("x", call, policy, clock, sleep) == "ok"
    assert call.num_calls == 8
    assert sleep.delays_s == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]


async def test_a_non_retryable_error_is_raised_at_once() -> None:
    clock = FakeClock()
    sleep = FakeSleep(clock)
    call = Flaky(InvalidArgument("step_json", "no step"))
    with pytest.raises(InvalidArgument):
        await retry_transient("x", call, RetryPolicy(), clock, sleep)
    assert call.num_calls == 1 and sleep.delays_s == []


async def test_the_last_error_is_raised_once_the_budget_is_spent() -> None:
    clock = FakeClock()
    sleep = FakeSleep(clock)
    call = Flaky(*[Unavailable(f"down {i}") for i in range(100)])
    policy = RetryPolicy(first_delay_s=1.0, max_delay_s=4.0, give_up_after_s=20.0)
    with pytest.raises(Unavailable) as info:
        await retry_transient("x", call, policy, clock, sleep)
    # Tries at 0, 1, 3, 7, 11, 15, 19, 23: the one at 23 s is past the budget.
    assert sleep.delays_s == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert str(info.value) == "down 7"


async def test_a_zero_budget_tries_once() -> None:
    clock = FakeClock()
    call = Flaky(Unavailable("down"))
    with pytest.raises(Unavailable):
        await retry_transient("x", call, RetryPolicy(give_up_after_s=0.0), clock,
                              FakeSleep(clock))
    assert call.num_calls == 1


@pytest.mark.parametrize(("kwargs", "word"), [
    ({"first_delay_s": 0.0}, "first_delay_s"),
    ({"first_delay_s": 3.0, "max_delay_s": 2.0}, "max_delay_s"),
    ({"give_up_after_s": -1.0}, "give_up_after_s"),
])
def test_an_inconsistent_policy_is_refused_naming_the_field(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        RetryPolicy(**kwargs)
