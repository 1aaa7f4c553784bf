"""Write the shipped Grafana dashboards (deploy/observability/grafana/dashboards/*.json).

The panels are listed here once, as (title, unit, PromQL queries); every metric a query
names comes from libra/metrics.py (tests/unit/deploy/test_observability.py checks it, and
that the JSON files are what this script writes). Run ``python scripts/gen_dashboards.py``
after changing a panel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "observability" / "grafana" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "libra-prometheus"}  # provisioning/datasources.yaml
J = '{job=~"$job"}'
W = "[$__rate_interval]"

# (title, unit, [(legend, expr)]) per panel; Grafana units: s, ops, short, percentunit.
Panel = tuple[str, str, list[tuple[str, str]]]

DASHBOARDS: dict[str, tuple[str, list[Panel]]] = {
    "overview": ("Libra: overview", [
        ("Reward mean (last step)", "short",
         [("{{job}}", f"libra_job_reward_mean{J}")]),
        ("Eval score (last round)", "short",
         [("{{job}} {{measure}}", f"libra_job_eval_score{J}")]),
        ("Step time by phase (mean per step)", "s",
         [("{{phase}}", f"sum by (phase) (rate(libra_job_step_phase_seconds_sum{J}{W})) / "
                        f"sum by (phase) (rate(libra_job_step_phase_seconds_count{J}{W}))")]),
        ("Trajectories trained /s", "ops",
         [("{{job}}", f"rate(libra_job_trajectories_trained_total{J}{W})")]),
        ("Tokens generated /s (all instances)", "ops",
         [("tokens/s", f"sum(rate(libra_rollout_tokens_generated_total{W}))")]),
        ("Dropped trajectories /s by reason", "ops",
         [("{{reason}}", f"sum by (reason) (rate(libra_job_dropped_total{J}{W}))")]),
        ("Step and policy version", "short",
         [("step {{job}}", f"libra_job_step{J}"),
          ("version {{job}}", f"libra_job_policy_version{J}")]),
        ("Jobs queued (pending admission)", "short",
         [("queued", "libra_coordinator_queued_jobs")]),
        ("RPC errors /s by service", "ops",
         [("{{service}}", f'sum by (service) (rate(libra_rpc_server_total{{code!="OK"}}{W}))')]),
        # Prometheus's own series: 0 while a target does not answer its scrape (a
        # stopped service); deploy/observability/alerts.yml fires LibraServiceDown on it.
        ("Services up (1 = scrape answered)", "short",
         [("{{service}} {{target}}", 'up{job="libra"}')]),
        ("Redis round trip (p50, p99)", "s",
         [("p50 {{service}}", "histogram_quantile(0.5, sum by (service, le) "
                              f"(rate(libra_redis_roundtrip_seconds_bucket{W})))"),
          ("p99 {{service}}", "histogram_quantile(0.99, sum by (service, le) "
                              f"(rate(libra_redis_roundtrip_seconds_bucket{W})))")]),
        ("Trace spans dropped /s by service", "ops",
         [("{{service}} {{reason}}",
           f"sum by (service, reason) (rate(libra_trace_spans_dropped_total{W}))")]),
    ]),
    "rollout-scheduler": ("Libra: rollout and scheduler", [
        ("Tokens /s per instance", "ops",
         [("{{instance}}", f"rate(libra_rollout_tokens_generated_total{W})")]),
        ("Trajectories finished /s per instance", "ops",
         [("{{instance}}", f"rate(libra_rollout_trajectories_finished_total{W})")]),
        ("Active trajectories per instance", "short",
         [("{{instance}}", "libra_rollout_active_trajectories")]),
        ("Engine batch size (p50, p90)", "short",
         [("p50 {{instance}}", "histogram_quantile(0.5, sum by (instance, le) "
                               f"(rate(libra_rollout_engine_batch_size_bucket{W})))"),
          ("p90 {{instance}}", "histogram_quantile(0.9, sum by (instance, le) "
                               f"(rate(libra_rollout_engine_batch_size_bucket{W})))")]),
        ("Queue depth (trajectories waiting for an instance)", "short",
         [("{{job}}", f"libra_scheduler_queued_trajectories{J}")]),
        ("Bucket occupancy", "short",
         [("{{bucket}}", f"sum by (bucket) (libra_scheduler_bucket_trajectories{J})")]),
        ("Migrations /s", "ops",
         [("{{job}}", f"rate(libra_scheduler_migrations_total{J}{W})")]),
        ("Idle instances while work waited", "short",
         [("{{job}}", f"libra_scheduler_idle_instances_while_queued{J}")]),
        ("Placement decisions /s", "ops",
         [("{{action}} {{reason}}",
           f"sum by (action, reason) (rate(libra_scheduler_decisions_total{W}))")]),
        ("Scheduler tick and decision batch time (p99)", "s",
         [("tick p99", "histogram_quantile(0.99, sum by (le) "
                       f"(rate(libra_scheduler_tick_seconds_bucket{W})))"),
          # The tick's own steps: the wall above less its waits for Redis and the
          # reports served meanwhile; CPU: less the host's other work too.
          ("tick own p99", "histogram_quantile(0.99, sum by (le) "
                           f"(rate(libra_scheduler_tick_own_seconds_bucket{W})))"),
          ("tick CPU p99", "histogram_quantile(0.99, sum by (le) "
                           f"(rate(libra_scheduler_tick_cpu_seconds_bucket{W})))"),
          ("decide batch p99", "histogram_quantile(0.99, sum by (le) "
                               f"(rate(libra_scheduler_decide_batch_seconds_bucket{W})))"),
          # Reports that arrived during a tick wait for its end (SchedulerCore.tick_done).
          ("report wait for the tick p99",
           "histogram_quantile(0.99, sum by (le) "
           f"(rate(libra_scheduler_report_tick_wait_seconds_bucket{W})))")]),
        ("Groups drawn /s", "ops",
         [("{{job}}", f"rate(libra_scheduler_groups_drawn_total{J}{W})")]),
        ("Policy version per instance", "short",
         [("{{instance}}", "libra_rollout_policy_version")]),
        ("Weight reload time per instance (mean)", "s",
         [("{{instance}}", f"rate(libra_rollout_weight_reload_seconds_sum{W}) / "
                           f"rate(libra_rollout_weight_reload_seconds_count{W})")]),
        ("Engine context use (tokens held / limit)", "percentunit",
         [("{{instance}}", "libra_rollout_engine_context_tokens / "
                           "(libra_rollout_engine_context_limit_tokens > 0)")]),
    ]),
    "training-elastic": ("Libra: training and elastic", [
        ("Step time by phase (mean per step)", "s",
         [("{{phase}}", f"sum by (phase) (rate(libra_job_step_phase_seconds_sum{J}{W})) / "
                        f"sum by (phase) (rate(libra_job_step_phase_seconds_count{J}{W}))")]),
        ("Step wall time (p50, p90)", "s",
         [("p50", "histogram_quantile(0.5, sum by (le) "
                  f"(rate(libra_job_step_wall_seconds_bucket{J}{W})))"),
          ("p90", "histogram_quantile(0.9, sum by (le) "
                  f"(rate(libra_job_step_wall_seconds_bucket{J}{W})))")]),
        ("Staleness of trained trajectories (p50, p99, versions)", "short",
         [("p50", "histogram_quantile(0.5, sum by (le) "
                  f"(rate(libra_trainer_staleness_bucket{J}{W})))"),
          ("p99", "histogram_quantile(0.99, sum by (le) "
                  f"(rate(libra_trainer_staleness_bucket{J}{W})))")]),
        ("Tokens trained /s", "ops",
         [("{{job}}", f"rate(libra_job_tokens_trained_total{J}{W})")]),
        ("Hybrid workers lent to training", "short",
         [("{{state}}", f"libra_job_hybrid_workers{J}")]),
        ("Worker roles (rollout instances)", "short",
         [("{{role}}", "sum by (role) (libra_rollout_role)")]),
        ("Trajectories placed per bucket /s", "ops",
         [("{{bucket}}", f"sum by (bucket) (rate(libra_job_bucket_placements_total{J}{W}))")]),
        ("Migrations per step", "short",
         [("{{job}}", f"rate(libra_job_migrations_total{J}{W}) / "
                      f"rate(libra_job_steps_total{J}{W})")]),
        ("Eval round", "short", [("{{job}}", f"libra_job_eval_round{J}")]),
        ("Planner decisions /s", "ops",
         [("{{decision}} {{elastic}}", "sum by (decision, elastic) "
                                       f"(rate(libra_job_planner_decisions_total{J}{W}))")]),
        ("Planner predicted gain per step", "s",
         [("{{job}}", f"libra_job_planner_predicted_gain_seconds{J}")]),
    ]),
    "tools": ("Libra: tools", [
        ("Tool calls /s by tool and status", "ops",
         [("{{tool}} {{status}}", f"sum by (tool, status) (rate(libra_tool_calls_total{W}))")]),
        ("Tool latency (p50, p95)", "s",
         [("p50 {{tool}}", "histogram_quantile(0.5, sum by (tool, le) "
                           f"(rate(libra_tool_call_seconds_bucket{W})))"),
          ("p95 {{tool}}", "histogram_quantile(0.95, sum by (tool, le) "
                           f"(rate(libra_tool_call_seconds_bucket{W})))")]),
        ("Share of calls not succeeding", "percentunit",
         [("{{tool}}", f'sum by (tool) (rate(libra_tool_calls_total{{status!="success"}}{W})) '
                       f"/ sum by (tool) (rate(libra_tool_calls_total{W}))")]),
        ("Calls running and waiting", "short",
         [("running {{tool}}", "libra_tool_calls_running"),
          ("waiting {{tool}}", "libra_tool_calls_waiting"),
          ("slots {{tool}}", "libra_tool_slots")]),
    ]),
}


def _panel(index: int, panel: Panel) -> dict:
    title, unit, queries = panel
    return {
        "id": index + 1, "type": "timeseries", "title": title, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr,
                     "legendFormat": legend} for i, (legend, expr) in enumerate(queries)],
    }


def dashboard(uid: str) -> dict:
    """The Grafana JSON model of dashboard ``uid``."""
    title, panels = DASHBOARDS[uid]
    return {
        "uid": f"libra-{uid}", "title": title, "tags": ["libra"], "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "editable": True,
        "templating": {"list": [{
            "name": "job", "label": "Job", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(libra_job_step, job)", "refId": "job"},
            "definition": "label_values(libra_job_step, job)", "refresh": 2,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}}]},
        "panels": [_panel(i, p) for i, p in enumerate(panels)],
    }


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{uid}.json": json.dumps(dashboard(uid), indent=2) + "\n" for uid in DASHBOARDS}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
