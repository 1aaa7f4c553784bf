"""``libra tool run/list --local``: the in-process gateway behind the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from libra_cli.main import main

ROW_KEYS = {"tool", "call_id", "status", "output", "error", "payload_tokens", "size_class",
            "latency_ms", "state", "truncated"}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_local_calculator(capsys):
    code, out, _ = run_cli(capsys, "tool", "run", "calculator", "--args",
                           '{"expression": "6 * 7"}', "--local", "--json")
    row = json.loads(out)
    assert code == 0 and set(row) == ROW_KEYS
    assert (row["status"], row["output"], row["error"]) == ("success", "42", "")
    assert (row["size_class"], row["state"], row["payload_tokens"]) == (
        "small", "calculator:small:success", 1)


def test_local_calculator_failure_exits_1(capsys):
    code, out, _ = run_cli(capsys, "tool", "run", "calculator", "--args",
                           '{"expression": "1 / 0"}', "--local")
    row = json.loads(out)  # pretty-printed JSON without --json
    assert code == 1 and (row["status"], row["error"]) == ("failure", "divide by zero")


def test_local_python(capsys):
    code, out, _ = run_cli(capsys, "tool", "run", "python", "--args",
                           '{"code": "print(sum(range(10)))"}', "--local", "--json",
                           "--call-id", "my-call")
    row = json.loads(out)
    assert code == 0 and row["call_id"] == "my-call"
    assert (row["status"], row["output"], row["state"]) == ("success", "45\n",
                                                            "python:small:success")


def test_local_python_timeout(capsys):
    code, out, _ = run_cli(capsys, "tool", "run", "python", "--args",
                           '{"code": "while True: pass"}', "--local", "--json",
                           "--deadline-ms", "500")
    assert code == 1 and json.loads(out)["state"] == "python:small:timeout"


def test_unknown_tool_exits_2_naming_known_tools(capsys):
    code, out, err = run_cli(capsys, "tool", "run", "nope", "--args", "{}", "--local")
    assert code == 2 and out == ""
    assert "unknown tool 'nope'" in err and "calculator, python, search" in err


@pytest.mark.parametrize("args_json, expected", [
    ("{code", "--args is not valid JSON"),
    ('["print(1)"]', "--args must be a JSON object"),
])
def test_bad_args_json_names_the_option(capsys, args_json, expected):
    code, out, err = run_cli(capsys, "tool", "run", "python", "--args", args_json, "--local")
    assert code == 2 and out == "" and expected in err


def test_args_failing_the_schema_name_the_field(capsys):
    code, _, err = run_cli(capsys, "tool", "run", "python", "--args", '{"cod": "1"}', "--local")
    assert code == 2 and "InvalidArgument: code:" in err


def test_local_list(capsys):
    code, out, _ = run_cli(capsys, "tool", "list", "--local", "--json")
    tools = {spec["name"]: spec for spec in json.loads(out)}
    assert code == 0 and sorted(tools) == ["calculator", "python", "search"]
    assert tools["python"]["args_schema"]["required"] == ["code"]


def test_local_rewards_lists_the_registry(capsys):
    code, out, _ = run_cli(capsys, "tool", "rewards", "--local", "--json")
    rewards = {r["name"]: r["description"] for r in json.loads(out)}
    assert code == 0 and sorted(rewards) == ["code_tests", "composite", "exact_match",
                                             "format", "llm_judge", "numeric"]
    assert "Weighted sum" in rewards["composite"]


def test_no_gateway_is_a_clear_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["--run-root", str(tmp_path), "tool", "run", "calculator", "--args", "{}"])
    assert "--toolgateway HOST:PORT" in str(info.value.code) and "--local" in str(info.value.code)


def test_cli_does_not_import_services_at_import_time():
    code = ("import sys, libra_cli.main\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'services')\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
