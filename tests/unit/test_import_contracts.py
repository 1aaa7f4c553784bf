"""The import contracts in pyproject.toml ([tool.importlinter]) hold: the layers
libra_cli > services | sim > scheduling > libra, services independent, cores and the
algorithms pure (type-checking imports count too), no import cycles inside a service.

``lint-imports`` reads the import graph statically, so it also sees imports that
``test_core_purity.py`` (which imports each core at run time) cannot: those under
``TYPE_CHECKING`` and those inside functions. A second test runs the same contracts over
a small tree that breaks each of them, so a contract that could never fail is caught.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(cwd: Path, config: Path) -> subprocess.CompletedProcess[str]:
    # --no-cache: a cache written by another tree (or before an edit) must not answer.
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(config)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_repository_keeps_its_import_contracts() -> None:
    out = _lint_imports(ROOT, ROOT / "pyproject.toml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 4 kept, 0 broken." in out.stdout, out.stdout


# One module per root package; each numbered violation breaks one contract.
_BROKEN_TREE = {
    "libra/__init__.py": "",
    "libra/proto/__init__.py": "",
    # 1. layers: the foundation imports the application
    "libra/base.py": "import libra_cli.main\n",
    "libra_cli/__init__.py": "",
    "libra_cli/main.py": "",
    "scheduling/__init__.py": "",
    "sim/__init__.py": "",
    "services/__init__.py": "",
    "services/coordinator/__init__.py": "",
    "services/rollout/__init__.py": "",
    "services/scheduler/__init__.py": "",
    "services/trainer/__init__.py": "",
    "services/toolgateway/__init__.py": "",
    # 2. independence: one service imports another
    "services/coordinator/core.py": "import services.scheduler.core\n",
    "services/scheduler/core.py": "",
    # 3. purity: a core reaches grpc indirectly, through a type-checking import
    "services/rollout/core.py": ("from typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    import services.rollout.client\n"),
    "services/rollout/client.py": "import grpc\n",
    # 4. acyclic: a reward imports the core that runs it
    "services/toolgateway/core.py": "import services.toolgateway.rewards\n",
    "services/toolgateway/rewards.py": ("from typing import TYPE_CHECKING\n"
                                        "if TYPE_CHECKING:\n"
                                        "    import services.toolgateway.core\n"),
    "services/trainer/core.py": "",
}


def test_the_contracts_fail_on_a_tree_that_breaks_each_of_them(tmp_path: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for name, text in _BROKEN_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / ".importlinter").write_text(_to_ini(config))
    out = _lint_imports(tmp_path, tmp_path / ".importlinter")
    assert out.returncode != 0
    assert "Contracts: 0 kept, 4 broken." in out.stdout, out.stdout
    for chain in ("libra.base -> libra_cli.main",
                  "services.coordinator.core -> services.scheduler.core",
                  "services.rollout.client -> grpc"):
        assert chain in out.stdout, out.stdout


def _to_ini(config: dict) -> str:
    """The [tool.importlinter] table as an .importlinter INI file (the same contracts,
    read from a file the tree under test owns, so its own root is the one analysed)."""
    lines = ["[importlinter]"] + _ini_fields({k: v for k, v in config.items()
                                              if k != "contracts"})
    for i, contract in enumerate(config["contracts"]):
        lines += ["", f"[importlinter:contract:{i}]"] + _ini_fields(contract)
    return "\n".join(lines) + "\n"


def _ini_fields(table: dict) -> list[str]:
    out = []
    for key, value in table.items():
        if isinstance(value, list):
            out.append(f"{key} =" + "".join(f"\n    {v}" for v in value))
        else:
            out.append(f"{key} = {str(value).lower() if isinstance(value, bool) else value}")
    return out
