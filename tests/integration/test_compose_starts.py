"""deploy/compose/compose.yaml executed, not only schema-checked: its services started as
processes from their own definitions (tests/integration/compose_local.py says exactly what
is translated for the missing container network) run a short job to the end."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.grpc_auth import ClientAuth
from tests.integration.compose_local import LocalCompose, interpolate
from tests.integration.stack_helpers import assert_exact_accounting, small_job, wait_for_job

pytestmark = pytest.mark.integration
SECRETS = ("LIBRA_API_TOKEN", "LIBRA_SERVICE_TOKEN", "LIBRA_REDIS_PASSWORD")


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCompose]:
    # What deploy/compose/.env holds (the README's recipe): three random secrets.
    environ = {name: secrets.token_urlsafe(32) for name in SECRETS}
    project = LocalCompose(tmp_path_factory.mktemp("compose"), environ)
    try:
        project.start()
        yield project
    finally:
        project.stop()


def test_interpolation_refuses_a_missing_secret_as_compose_does() -> None:
    with pytest.raises(ValueError, match="LIBRA_SERVICE_TOKEN: set LIBRA_SERVICE_TOKEN"):
        interpolate("${LIBRA_SERVICE_TOKEN:?set LIBRA_SERVICE_TOKEN}", {})
    assert interpolate("${LIBRA_PUBLISH_HOST:-127.0.0.1}:$$x", {}) == "127.0.0.1:$x"


async def test_every_service_starts_healthy_and_a_job_runs_through_them(
        compose: LocalCompose) -> None:
    assert set(compose.procs) == set(compose.services)
    address = f"127.0.0.1:{compose.local('coordinator', 50051)}"
    client = GrpcCoordinatorClient(address, 10.0, auth=ClientAuth(
        token=compose.environ["LIBRA_API_TOKEN"]))
    try:
        job = await client.create_job(small_job(), "json")
        job, steps, counters = await wait_for_job(client, job.job_id)
        assert job.state is t.JobState.SUCCEEDED, job.message
        assert [s["step"] for s in steps] == [1, 2, 3]
        redis_url = compose.env("coordinator")["LIBRA_COORDINATOR_REDIS_URL"]
        assert_exact_accounting(redis_url, job, steps, counters)
        # Weights went through the shared `runs` volume, as the compose file says.
        weights = list((compose.root / "volumes" / "runs" / job.job_id / "weights")
                       .glob("v*.safetensors"))
        assert weights, "the trainer wrote no weights into the runs volume"
    finally:
        await client.close()
    for name, proc in compose.procs.items():
        assert proc.poll() is None, f"{name} exited: {compose.log(name)[-2000:]}"
