"""The tool gateway over real gRPC: results, causal state, errors, deadlines, rewards.

Real: ``build_core`` (the subprocess sandbox, the built-in tools and rewards), the
servicer, ``libra.grpcx.Server`` on port 0 (error interceptor) and the typed client.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import uuid
from pathlib import Path

import grpc
import pytest

from libra import types as t
from libra.errors import InvalidArgument, ResourceExhausted, error_from_status
from libra.grpcx import insecure_channel
from libra.proto.toolgateway.v1 import toolgateway_pb2 as pb
from libra.proto.toolgateway.v1 import toolgateway_pb2_grpc as pb_grpc
from libra.wire.toolgateway import tool_result_from_proto
from libra_cli.main import main as cli_main
from services.toolgateway.sandbox import SandboxConfig
from tests.waiting import wait_until

SANDBOX_ROOT = SandboxConfig().work_root_dir

S, F, T = t.ToolStatus.SUCCESS, t.ToolStatus.FAILURE, t.ToolStatus.TIMEOUT


async def calc(gw, expression: str, call_id: str = "c1") -> t.ToolResult:
    return await gw.client.execute("traj", call_id, "calculator", {"expression": expression},
                                   5000)


async def py(gw, code: str, call_id: str = "p1", deadline_ms: int = 20_000):
    return await gw.client.execute("traj", call_id, "python", {"code": code}, deadline_ms)


# -- execute: results and the causal state ---------------------------------------------

async def test_calculator_success_carries_causal_state(gateway):
    res = await calc(gateway, "6 * 7")
    assert (res.status, res.output, res.error) == (S, "42", "")
    assert res.payload_tokens == 1 and res.latency_ms >= 0 and not res.truncated
    assert res.state == t.ToolReturnState("calculator", t.SizeClass.SMALL, S)
    assert res.state.key == "calculator:small:success"


async def test_calculator_busy_when_transient_rate_is_one(start_gateway):
    gw = await start_gateway(calculator_transient_failure_rate=1.0)
    res = await calc(gw, "1 + 1")
    assert (res.status, res.error, res.state.key) == (F, "busy", "calculator:small:failure")


async def test_calculator_bad_expression_is_a_failed_call_not_an_error(gateway):
    res = await calc(gateway, "2 +")
    assert (res.status, res.output, res.error) == (F, "", "syntax")
    assert res.state.key == "calculator:small:failure"


@pytest.mark.parametrize("chars, size", [(10, t.SizeClass.SMALL), (2100, t.SizeClass.MEDIUM),
                                         (25_000, t.SizeClass.LARGE)])
async def test_python_tool_size_class_follows_payload_tokens(gateway, chars, size):
    res = await py(gateway, f"print('x' * {chars})")
    assert res.status is S and res.output == "x" * chars + "\n"
    assert res.payload_tokens == -(-(chars + 1) // 4)  # ceil(chars / 4) incl. the newline
    assert res.state == t.ToolReturnState("python", size, S)


async def test_python_error_returns_traceback_as_failure(gateway):
    res = await py(gateway, "print('before')\nraise ValueError('boom')")
    assert res.status is F and res.error == "exit code 1"
    assert "before" in res.output and "ValueError: boom" in res.output


async def test_deadline_propagates_to_the_sandbox(gateway):
    # The code sleeps 5 s, within the python tool's own 10 s limit (python_timeout_s): it
    # times out only if the call's 500 ms deadline reached the sandbox. The RPC's own
    # deadline is generous here, so only the call's budget can cut the tool short.
    async with insecure_channel(gateway.address) as channel:
        resp = await pb_grpc.ToolGatewayServiceStub(channel).ExecuteToolCall(
            pb.ExecuteToolCallRequest(trajectory_id="traj", call_id="p1", tool="python",
                                      args_json=json.dumps({"code": "import time\n"
                                                            "time.sleep(5)"}),
                                      deadline_ms=500), timeout=60)
    res = tool_result_from_proto(resp, "p1")
    assert res.status is T and res.state.key == "python:small:timeout"


# -- refusals map to libra.errors ------------------------------------------------------

async def test_unknown_tool_is_invalid_argument_naming_known_tools(gateway):
    with pytest.raises(InvalidArgument) as info:
        await gateway.client.execute("traj", "c", "nope", {}, 5000)
    assert info.value.field == "tool"
    assert "known tools: calculator, python, search" in info.value.reason


async def test_args_failing_the_schema_name_the_field(gateway):
    with pytest.raises(InvalidArgument) as info:
        await gateway.client.execute("traj", "c", "calculator", {"expr": "1"}, 5000)
    assert info.value.field == "expression"


@pytest.mark.parametrize("args_json", ["{not json", "[1, 2]"])
async def test_invalid_args_json_is_invalid_argument(gateway, args_json):
    async with insecure_channel(gateway.address) as channel:
        stub = pb_grpc.ToolGatewayServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ExecuteToolCall(pb.ExecuteToolCallRequest(
                trajectory_id="traj", call_id="c", tool="calculator", args_json=args_json,
                deadline_ms=1000), timeout=5)
    err = error_from_status(info.value.code().name, info.value.details())
    assert isinstance(err, InvalidArgument) and err.field == "args_json"


async def test_full_lane_maps_to_resource_exhausted(start_gateway):
    gw = await start_gateway(max_concurrency_per_tool=1, max_queue_depth_per_tool=0,
                             python_timeout_s=120.0)
    # The first call holds the lane until the test releases it (a marker file in its
    # working dir says it runs), so the others find it full however slowly it started.
    marker = f"held-{uuid.uuid4().hex}"
    holder = asyncio.ensure_future(py(
        gw, f"import os, time\nopen({marker!r}, 'w').close()\n"
        "while not os.path.exists('release'):\n    time.sleep(0.02)\nprint(1)",
        call_id="s0", deadline_ms=120_000))
    held: list[str] = []
    await wait_until(lambda: held.extend(glob.glob(f"{SANDBOX_ROOT}/*/{marker}")) or held)
    outcomes = await asyncio.gather(*(py(gw, "print(1)", call_id=f"s{i}") for i in (1, 2, 3)),
                                    return_exceptions=True)
    Path(held[0]).with_name("release").touch()
    outcomes.append(await holder)
    exhausted = [o for o in outcomes if isinstance(o, ResourceExhausted)]
    ok = [o for o in outcomes if isinstance(o, t.ToolResult) and o.status is S]
    assert (len(ok), len(exhausted)) == (1, 3), outcomes
    assert "retry after" in str(exhausted[0])
    assert all(1 <= e.retry_after_ms <= 10_000 for e in exhausted)  # the server's hint
    assert (await py(gw, "print(2)", call_id="after")).output == "2\n"


# -- score and list --------------------------------------------------------------------

@pytest.mark.parametrize("reward, final_text, reference, expected", [
    ("exact_match", "  The Answer. ", "the answer", 1.0),
    ("exact_match", "an answer", "the answer", 0.0),
    ("numeric", "so the result is 3/4.", "0.75", 1.0),
    ("numeric", "The answer is $1,234", "1234", 1.0),
    ("numeric", "I think 41", "42", 0.0),
])
async def test_score(gateway, reward, final_text, reference, expected):
    out = await gateway.client.score(t.ScoreInput("traj", reward, final_text, reference))
    assert out.reward == expected


async def test_score_unknown_reward_is_invalid_argument(gateway):
    with pytest.raises(InvalidArgument) as info:
        await gateway.client.score(t.ScoreInput("traj", "nope", "x", "y"))
    assert info.value.field == "reward" and "exact_match" in info.value.reason


async def test_list_rewards_returns_the_registry(gateway):
    rewards = {r["name"]: r for r in await gateway.client.list_rewards()}
    assert sorted(rewards) == ["code_tests", "composite", "exact_match", "format",
                               "llm_judge", "numeric"]
    assert all(r["description"] for r in rewards.values())


async def test_composite_score_carries_the_transcript_and_its_components(gateway):
    messages = (t.TranscriptMessage("user", "2+2?"),
                t.TranscriptMessage("assistant", "<call>", (t.TranscriptToolCall("calculator",
                                                                                 "{}"),)),
                t.TranscriptMessage("tool", "err", name="invalid", tool_status="failure"),
                t.TranscriptMessage("assistant", "4"))
    options = {"components": [{"name": "exact_match", "weight": 1.0},
                              {"name": "format", "weight": 0.5}]}
    out = await gateway.client.score(t.ScoreInput(
        "traj", "composite", "4", "4", messages, "", 2, json.dumps(options)))
    # format: answer present (0.5) + 0 of 1 calls well formed (0) = 0.5
    assert out.components == {"exact_match": 1.0, "format": 0.5}
    assert out.reward == pytest.approx(1.0 + 0.5 * 0.5)


async def test_list_tools_returns_schemas(gateway):
    tools = {spec["name"]: spec for spec in await gateway.client.list_tools()}
    assert sorted(tools) == ["calculator", "python", "search"]
    assert tools["python"]["args_schema"]["required"] == ["code"]
    assert tools["calculator"]["args_schema"]["properties"] == {"expression": {"type": "string"}}
    assert tools["calculator"]["idempotent"] and not tools["python"]["idempotent"]
    assert all(spec["description"] for spec in tools.values())


# -- hostile code: one smoke test through the server -----------------------------------

async def test_gateway_keeps_serving_after_hostile_calls(gateway):
    if os.geteuid() == 0:  # RLIMIT_NPROC only binds under the per-call uid (root drops to it)
        bomb = ("import os, time\nn = 0\nfor _ in range(300):\n    try:\n"
                "        pid = os.fork()\n    except OSError:\n        break\n"
                "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    n += 1\n"
                "print(n)")
        res = await py(gateway, bomb, call_id="bomb")
        assert res.status is S and int(res.output) < 32
    res = await py(gateway, "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)",
                   call_id="killpg")
    assert res.status is F and res.error == "killed by SIGKILL"
    res = await py(gateway, "print(6 * 7)", call_id="after")
    assert (res.status, res.output) == (S, "42\n")
    assert (await calc(gateway, "1 + 2", call_id="after-calc")).output == "3"


# -- the CLI against a running gateway -------------------------------------------------

async def test_cli_tool_run_through_the_gateway(gateway, capsys):
    argv = ["tool", "run", "calculator", "--args", '{"expression": "2 ** 10"}', "--json",
            "--toolgateway", gateway.address]
    assert await asyncio.to_thread(cli_main, argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["status"], row["output"], row["state"]) == ("success", "1024",
                                                            "calculator:small:success")


async def test_cli_finds_the_gateway_in_the_stack_state(gateway, tmp_path, capsys):
    state_dir = tmp_path / ".libra"
    state_dir.mkdir()
    (state_dir / "state.json").write_text(json.dumps({
        "supervisor_pid": os.getpid(),
        "services": [{"name": "toolgateway", "pid": os.getpid(), "port": gateway.server.port,
                      "metrics_port": -1, "restarts": 0, "log_path": ""}]}))
    argv = ["--run-root", str(tmp_path), "tool", "run", "python", "--args",
            '{"code": "print(7)"}', "--json"]
    assert await asyncio.to_thread(cli_main, argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["status"], row["output"], row["size_class"]) == ("success", "7\n", "small")
    argv = ["--run-root", str(tmp_path), "tool", "list", "--json"]
    assert await asyncio.to_thread(cli_main, argv) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)] == [
        "calculator", "python", "search"]
    argv = ["--run-root", str(tmp_path), "tool", "rewards", "--json"]
    assert await asyncio.to_thread(cli_main, argv) == 0
    assert "composite" in [r["name"] for r in json.loads(capsys.readouterr().out)]
