"""Decision latency of the scheduler service over gRPC + Redis on loopback.

Starts a real redis-server, the scheduler core with its Redis stores (write-behind
policy store included) and its admission/placement loop, and a ``libra.grpcx.Server``
with the scheduler servicer, all in this process. The C-MLFQ tree is seeded with
synthetic finished trajectories first. A driver in a child process (its own event loop
and GIL, as a rollout instance would be) sends tool-return reports open-loop at a fixed
rate (default 500/s for 10 s) over the trajectories the scheduler placed, and times
every report at the client (the client batches concurrent reports on its
``ToolReturns`` stream, as a rollout instance's does). Prints p50/p90/p99/max in ms,
the achieved rate and the share of moves.

Usage: ``python benchmarks/bench_scheduler_grpc.py [--json] [--rate 500] [--seconds 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from libra import redis_keys as keys  # noqa: E402
from libra import types as t  # noqa: E402
from libra.clock import SystemClock  # noqa: E402
from libra.grpcx import Registration, Server  # noqa: E402
from libra.jobspec import job_spec_from_dict  # noqa: E402
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc  # noqa: E402
from libra.service_config import ServerConfig  # noqa: E402
from libra_cli.redis_server import start_redis  # noqa: E402
from scheduling.policy import CmlfqPolicy, TrajectoryDescriptor  # noqa: E402
from services.scheduler.core import SchedulerCore, build_layout, build_policy_config  # noqa: E402
from services.scheduler.servicer import SchedulerServicer  # noqa: E402
from services.scheduler.store import RedisPolicyStore, RedisSchedulerStore  # noqa: E402

JOB = "bench-job"
STATES = [t.ToolReturnState(tool, size, status) for tool in ("calculator", "search")
          for size in t.SizeClass for status in t.ToolStatus]
INSTANCES = [("r-short-0", "short"), ("r-short-1", "short"), ("r-long-0", "long"),
             ("r-long-1", "long")]

# The driver runs in a child process; it reads its arguments as JSON on stdin.
DRIVER = r'''
import asyncio, json, random, sys, time
sys.path.insert(0, ROOT)
from libra import types as t
from libra.clients.runner import GrpcSchedulerClient

async def main(cfg):
    client = GrpcSchedulerClient(cfg["address"])
    states = [t.ToolReturnState.from_key(k) for k in cfg["states"]]
    trajs, rng = cfg["trajectories"], random.Random(0)
    tokens = {tid: 0 for tid in trajs}
    latencies, actions = [], {"stay": 0, "move": 0}
    async def one(i):
        tid = trajs[i % len(trajs)]
        tokens[tid] += rng.randint(20, 400)
        started = time.perf_counter()
        d = await client.report_tool_return(cfg["job_id"], tid, rng.choice(states),
                                            tokens[tid], "bench", 1)
        latencies.append((time.perf_counter() - started) * 1000)
        actions[d.action.value] += 1
    await one(0)  # warm the channel
    latencies.clear()
    n = int(cfg["rate"] * cfg["seconds"])
    start = time.perf_counter()
    tasks = []
    for i in range(n):  # open loop: send on schedule whatever the latency
        delay = start + i / cfg["rate"] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    await client.close()
    print(json.dumps({"latencies_ms": latencies, "actions": actions, "elapsed_s": elapsed}))

asyncio.run(main(json.load(sys.stdin)))
'''.replace("ROOT", repr(str(ROOT)))


def spec_json() -> str:
    return job_spec_from_dict({
        "name": "bench",
        "algorithm": {"prompts_per_step": 64, "samples_per_prompt": 4, "max_staleness": 0},
        "layout": {"policy": "cmlfq", "buckets": [
            {"name": "short", "max_tokens": 2_000, "max_trajectories_per_instance": 256},
            {"name": "long", "max_tokens": 16_000, "max_trajectories_per_instance": 256}]},
    }).to_json()


async def seed(r: aioredis.Redis, num_finished: int) -> None:
    """Job, instances, published policy, and a tree taught by synthetic trajectories."""
    spec = spec_json()
    await r.hset(keys.job(JOB), mapping={"spec_json": spec, "state": "running", "step": 1})
    await r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await r.hset(keys.policy(JOB), mapping={"version": 0})
    for instance, bucket in INSTANCES:
        await r.sadd(keys.WORKERS, instance)
        await r.hset(keys.lease(instance), mapping={"role": "core-rollout", "bucket": bucket})
    # The driver reports as worker "bench" at lease epoch 1 (reports are fenced).
    await r.sadd(keys.WORKERS, "bench")
    await r.hset(keys.lease("bench"), mapping={"role": "service", "epoch": 1})
    store = RedisPolicyStore(r, JOB)
    job_spec = job_spec_from_dict(json.loads(spec))
    config = build_policy_config(job_spec)
    assert config is not None
    policy = CmlfqPolicy(build_layout(job_spec), store, config)
    loads = [t.InstanceLoad(t.InstanceId(i), b, 0) for i, b in INSTANCES]
    rng = random.Random(0)
    for n in range(num_finished):
        tid = t.TrajectoryId(f"seed-{n}")
        policy.begin(TrajectoryDescriptor(tid, t.PromptId(f"p{rng.randrange(64)}")), loads)
        position = 0
        for _ in range(rng.randint(1, 8)):
            position += rng.randint(20, 400)
            policy.on_tool_return(tid, rng.choice(STATES), position, loads)
        policy.finish(tid, position + rng.randint(0, 6_000))
    policy.on_step_end(1)
    await store.flush()


async def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = start_redis(Path(tmp) / "redis")
        r = aioredis.from_url(redis_server.url, decode_responses=False)
        try:
            await seed(r, args.seed_trajectories)
            core = SchedulerCore(RedisSchedulerStore(r), SystemClock(), tick_s=0.05)
            name = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
            server = Server("scheduler", ServerConfig(host="127.0.0.1", port=0, metrics_port=-1),
                            [Registration(scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                                          SchedulerServicer(core), name)])
            await server.start()
            loop_task = asyncio.create_task(core.run())  # admits and places 256 trajectories
            while len(await r.hkeys(keys.assignments(JOB))) < 256:
                await asyncio.sleep(0.05)
            trajectories = sorted(k.decode() for k in await r.hkeys(keys.assignments(JOB)))
            driver_in = json.dumps({
                "address": f"127.0.0.1:{server.port}", "job_id": JOB, "rate": args.rate,
                "seconds": args.seconds, "trajectories": trajectories,
                "states": [s.key for s in STATES]})
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", DRIVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            out, _ = await proc.communicate(driver_in.encode())
            await core.drain(0)
            await loop_task
            await server.stop()
        finally:
            await r.aclose()
            redis_server.stop()
    result = json.loads(out)
    lat = sorted(result["latencies_ms"])

    def pct(q: float) -> float:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)

    n = len(lat)
    return {"rate_target_per_s": args.rate, "decisions": n,
            "rate_achieved_per_s": round(n / result["elapsed_s"], 1),
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
            "max_ms": round(lat[-1], 3), "mean_ms": round(sum(lat) / n, 3),
            "moves": result["actions"]["move"],
            "move_share": round(result["actions"]["move"] / n, 4),
            "seed_trajectories": args.seed_trajectories}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rate", type=float, default=500.0, help="decisions per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed-trajectories", type=int, default=2_000,
                        help="synthetic finished trajectories in the tree")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result))
        return
    print(f"Tool-return reports over gRPC + Redis (loopback), {result['decisions']} decisions "
          f"at {result['rate_achieved_per_s']}/s (target {args.rate:g}/s)")
    print(f"  latency ms: p50 {result['p50_ms']}  p90 {result['p90_ms']}  "
          f"p99 {result['p99_ms']}  max {result['max_ms']}  mean {result['mean_ms']}")
    # Decisions only: a move is committed by the rollout's handoff, and no rollout runs here.
    print(f"  moves decided: {result['moves']} ({result['move_share']:.1%})")


if __name__ == "__main__":
    main()
