"""Files shipped beside the code (parity.shipped) are found from any working folder, and the wheel packages every
one the code asks for, so a non-editable install (the container's) finds them too."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from parity.shipped import shipped

ROOT = Path(__file__).resolve().parents[1]


def test_every_shipped_path_the_code_names_is_in_the_wheel():
    wanted = {m for f in (ROOT / "src" / "parity").rglob("*.py")
              for m in re.findall(r'shipped\("([^"]+)"\)', f.read_text(encoding="utf-8"))}
    assert {"schemas", "config/study-reference.yaml", "config/sim/h200-llama31-8b.yaml"} <= wanted
    included = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
        "force-include"]
    for path in wanted:
        assert any(path == src or path.startswith(src + "/") for src in included), path
        src = next(s for s in included if path == s or path.startswith(s + "/"))
        assert included[src] == "parity/" + src  # where `shipped` looks for it in an installed package


def test_a_shipped_file_is_the_checkouts_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shipped("config/study-reference.yaml") == ROOT / "config" / "study-reference.yaml"
