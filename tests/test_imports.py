"""The house's floors hold: no import cycle, no import up a floor (contracts in pyproject.toml [tool.importlinter]).

The stack without cycles or upward imports is the code's best structural property; these tests keep it true as
rooms are added. A new room must be put on a floor by name, so no module escapes the contract unseen.
"""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "parity"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}
# Imports a contract is told to ignore: each is debt someone must see, not a way to let a new one in.
KNOWN_DEBT: set[str] = set()  # none now: the study's context moved below trace and engine (parity.study)


def test_contracts_kept():
    """lint-imports over this checkout's src (PYTHONPATH: not an installed copy); a broken contract is shown."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), f"{lint} missing: pip install -e '.[test]' (import-linter)"
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, env=os.environ | {"PYTHONPATH": str(PACKAGE.parent)},
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[out.find("Broken contracts"):] if "Broken contracts" in out else out


def _rooms() -> set[str]:
    """The direct children of src/parity: modules and packages, as the floors name them."""
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def test_every_room_on_a_floor():
    """The contract bites only where it looks: each room is named on a floor, and no floor names a ghost."""
    floors = CONTRACTS["floors"]
    assert floors["type"] == "layers" and floors["containers"] == ["parity"] and floors["exhaustive"]
    assert len(floors["layers"]) >= 13, "the floors contract lost floors"
    assert {"no-cycles", "engine-unaware-of-serving", "serving-paths-apart", "flame-worker-not-driver",
            "report-reads-evidence", "routing-sees-tokens-only"} <= CONTRACTS.keys(), (
        "a contract was dropped from [tool.importlinter]")
    named = {room.strip() for layer in floors["layers"] for room in layer.replace(":", "|").split("|")}
    named |= set(floors.get("exhaustive_ignores", ()))
    for room in sorted(_rooms() - named):
        raise AssertionError(f"src/parity/{room} is on no floor: name it in pyproject.toml [tool.importlinter] "
                             f"'floors' layers, on the lowest floor above every room it imports")
    assert not named - _rooms(), f"floors name rooms that do not exist: {sorted(named - _rooms())}"
    ignored = {i for c in CONFIG["contracts"] for i in c.get("ignore_imports", ())}
    assert ignored <= KNOWN_DEBT, (f"new ignore_imports {sorted(ignored - KNOWN_DEBT)} hide an upward import or a "
                                   f"cycle: move the import instead")


def test_the_report_may_read_flame_settings_but_none_of_flames_running_code():
    """The report reads Flame's settings through their class; every other module of parity.flame stays forbidden
    to it, so a new one is forbidden by being named, not by being remembered."""
    readable = {"__init__", "settings", "admission"}  # settings, as data
    forbidden = set(CONTRACTS["report-reads-evidence"]["forbidden_modules"])
    for module in sorted(p.stem for p in (PACKAGE / "flame").glob("*.py")):
        assert module in readable or f"parity.flame.{module}" in forbidden, (
            f"parity.flame.{module} is not forbidden to the report: add it to pyproject.toml's report-reads-evidence")
