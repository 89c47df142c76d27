"""The pinned image's recipe, read offline: the Apptainer def file, the hash lock, and the image manifest.

Apptainer cannot be installed on every CI host (Debian has no package), so pins are audited by
parsing `containers/parity.def` and `containers/requirements.lock` rather than by building. The
checks here are the ones a reviewer would do by eye: every base image pinned by digest, every Python
requirement pinned to one version with a hash, and the versions the image's `%test` asserts equal to
the locked ones. Standard library only, so the same code runs inside the image's `%post` before
any package is installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from parity.errors import ParityError, first_problem

# Sections Apptainer knows (userdocs "definition_files"); a `%word` line that is none of these is script.
SECTION_NAMES = frozenset({"arguments", "setup", "files", "post", "test", "environment", "runscript",
                           "startscript", "labels", "help"})
DIGEST_PIN = re.compile(r"@sha256:[0-9a-f]{64}$")
HASH_OPTION = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
# `%test` lines `expect DIST MODULE VERSION`: the installed version the built image must report.
EXPECT = re.compile(r"^expect\s+(\S+)\s+(\S+)\s+(\S+)\s*$")
UNVERIFIED = "# UNVERIFIED"
# `{{ NAME }}` in a def file: a build argument, its default in the stage's `%arguments` (Apptainer >= 1.3).
BUILD_ARG = re.compile(r"{{\s*(\w+)\s*}}")
STAGE_START = re.compile(r"(?mi)^bootstrap:")
# The lock's note on an sdist, written by containers/lock.py from the sdist's [build-system] requires.
SDIST_NOTE = re.compile(r"^# (\S+): sdist only .*; build requires: (.+)$")


class ContainerError(ParityError):
    """A def file or lock file that cannot be parsed; the message names the file and line."""


# ---- the def file ------------------------------------------------------------------------------

@dataclass
class Stage:
    """One build stage: its header keywords and its sections, each a list of lines (indent stripped).

    Section keys are the section header without `%`: "post", "test", "files", "files from fsm".
    A repeated section is concatenated, as Apptainer does.
    """

    headers: dict[str, str] = field(default_factory=dict)
    sections: dict[str, list[str]] = field(default_factory=dict)

    @property
    def name(self) -> str | None:
        return self.headers.get("Stage")

    @property
    def base(self) -> str | None:
        return self.headers.get("From")

    def lines(self, section: str) -> list[str]:
        """Non-blank, non-comment lines of a section ([] if absent)."""
        return [line for line in self.sections.get(section, []) if line and not line.startswith("#")]

    def files(self, source_stage: str | None = None) -> list[tuple[str, str]]:
        """(source, destination) pairs of `%files` or `%files from STAGE`; a missing destination is the source."""
        key = "files" if source_stage is None else f"files from {source_stage}"
        pairs = []
        for line in self.lines(key):
            parts = line.split()
            pairs.append((parts[0], parts[1] if len(parts) > 1 else parts[0]))
        return pairs

    def labels(self) -> dict[str, str]:
        """`%labels` as Apptainer stores them: the name, then the rest of the line after the first space."""
        out = {}
        for line in self.lines("labels"):
            name, _, value = line.partition(" ")
            out[name] = value.strip()
        return out

    def expectations(self) -> dict[str, tuple[str, str]]:
        """Distribution → (import name, version) from the `expect` lines of `%test`."""
        found = {}
        for line in self.lines("test"):
            match = EXPECT.match(line)
            if match:
                dist, module, version = match.groups()
                found[dist] = (module, version)
        return found


def parse_definition(text: str, *, source: str = "<def>") -> list[Stage]:
    """Stages in file order. A `Bootstrap:` line at the start of a line always opens a new stage."""
    stages: list[Stage] = []
    section: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        keyword = re.match(r"^([A-Za-z]+):\s*(.*)$", raw)
        if keyword and keyword.group(1).lower() == "bootstrap":
            stages.append(Stage())
            section = None
        head = re.match(r"^%([a-z]+)\b\s*(.*)$", stripped)
        if head and head.group(1) in SECTION_NAMES and not raw[:1].isspace():
            if not stages:
                raise ContainerError(f"{source}:{number}: section %{head.group(1)} before any Bootstrap: header")
            section = head.group(1) + (f" {head.group(2).strip()}" if head.group(2).strip() else "")
            stages[-1].sections.setdefault(section, [])
            continue
        if section is not None:
            stages[-1].sections[section].append(stripped)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if not keyword:
            raise ContainerError(f"{source}:{number}: expected a 'Keyword: value' header, got {stripped!r}")
        if not stages:
            raise ContainerError(f"{source}:{number}: Bootstrap: must be the first keyword")
        stages[-1].headers[keyword.group(1)] = keyword.group(2).strip()
    if not stages:
        raise ContainerError(f"{source}: no Bootstrap: header")
    return stages


def render_definition(text: str, build_args: dict[str, str] | None = None, *, source: str = "<def>") -> str:
    """The def file as Apptainer builds it: every `{{ NAME }}` replaced, stage by stage.

    As Apptainer does: a value from `--build-arg` (build_args) wins, else the stage's own
    `%arguments` default; a comment line is left alone; a name with neither is an error.
    """
    build_args = build_args or {}
    starts = [m.start() for m in STAGE_START.finditer(text)]
    chunks = [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)]) if b > a]
    out = []
    for chunk in chunks:
        defaults = _argument_defaults(chunk)
        lines = []
        for line in chunk.splitlines(keepends=True):
            if line.lstrip().startswith("#"):
                lines.append(line)
                continue

            def value(match: re.Match) -> str:
                name = match.group(1)
                if name in build_args:
                    return build_args[name]
                if name in defaults:
                    return defaults[name]
                raise ContainerError(f"{source}: build argument {name} has no value (no --build-arg, no %arguments default)")

            lines.append(BUILD_ARG.sub(value, line))
        out.append("".join(lines))
    return "".join(out)


def split_post(text: str) -> tuple[str, str]:
    """(the def without the last stage's %post, that %post's script): for the sandbox route of
    containers/build.sh, which runs the script itself with `apptainer exec --writable`."""
    lines = text.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if re.match(r"^%([a-z]+)\b", line)
             and line[1:].split()[0] in SECTION_NAMES or STAGE_START.match(line)]
    posts = [i for i in heads if lines[i].split()[0] == "%post"]
    if not posts:
        raise ContainerError("the def file has no %post")
    start = posts[-1]
    end = next((i for i in heads if i > start), len(lines))
    return "".join(lines[:start] + lines[end:]), "".join(lines[start + 1:end])


def _argument_defaults(chunk: str) -> dict[str, str]:
    """KEY=VALUE lines of a stage's `%arguments` section."""
    defaults, inside = {}, False
    for raw in chunk.splitlines():
        if raw[:1] == "%":
            inside = raw.strip() == "%arguments"
            continue
        line = raw.strip()
        if inside and line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            defaults[key.strip()] = value.strip()
    return defaults


def read_definition(path: Path | str, build_args: dict[str, str] | None = None) -> list[Stage]:
    """Stages of the def file rendered with its defaults, or with `build_args` as `--build-arg` would."""
    path = Path(path)
    text = render_definition(path.read_text(encoding="utf-8"), build_args, source=str(path))
    return parse_definition(text, source=str(path))


def _joined_lines(lines: list[str]) -> list[str]:
    """Script lines with backslash continuations joined."""
    joined, current = [], ""
    for line in lines:
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            joined.append(current)
            current = ""
    return joined


def _pip_installs(lines: list[str]) -> list[str]:
    """`pip install` commands of a script section, with backslash continuations joined."""
    return [cmd for cmd in _joined_lines(lines) if re.search(r"\bpip3?\s+install\b", cmd)]


def definition_problems(stages: list[Stage]) -> list[str]:
    """Why the def file does not pin everything it builds from; [] if it does."""
    problems = []
    for index, stage in enumerate(stages):
        where = f"stage {stage.name or index}"
        if stage.headers.get("Bootstrap") != "docker":
            problems.append(f"{where}: Bootstrap must be docker, got {stage.headers.get('Bootstrap')!r}")
        if not stage.base or not DIGEST_PIN.search(stage.base):
            problems.append(f"{where}: From {stage.base!r} is not pinned by @sha256: digest")
        if len(stages) > 1 and not stage.name:
            problems.append(f"{where}: a multi-stage build needs Stage: on every stage")
        for cmd in _pip_installs(stage.lines("post")):
            if "--no-deps" not in cmd.split():
                problems.append(f"{where}: pip install without --no-deps: {cmd}")
            if "--require-hashes" not in cmd.split() and "--no-index" not in cmd.split():
                problems.append(f"{where}: pip install neither --require-hashes nor --no-index: {cmd}")
    return problems


# ---- the lock file -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Pin:
    """One locked requirement: exact version and the sha256 hashes pip may accept."""

    name: str
    version: str
    hashes: tuple[str, ...]
    line: int


def canonical_name(name: str) -> str:
    """PEP 503 normalisation, so `PyYAML`, `pyyaml` and `py_yaml` are one key."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash continuations joined and comments dropped."""
    out, current, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not current:
            start = number
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            out.append((start, current.strip()))
        current = ""
    if current.strip():
        out.append((start, current.strip()))
    return out


def lock_problems(text: str, *, source: str = "<lock>") -> list[str]:
    """Why the lock is not fit for `pip install --require-hashes --no-deps`; [] if it is."""
    problems = []
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.strip().startswith(UNVERIFIED):
            problems.append(f"{source}:{number}: a pin marked UNVERIFIED: {raw.strip()}")
    seen: dict[str, int] = {}
    for number, line in _logical_lines(text):
        requirement, *options = line.split()
        if requirement.startswith("-"):
            problems.append(f"{source}:{number}: option {requirement!r} outside a requirement; "
                            "only name==version --hash=sha256:... lines are allowed")
            continue
        match = PIN.match(requirement)
        if not match:
            problems.append(f"{source}:{number}: {requirement!r} is not pinned to one exact version (name==version)")
            continue
        name = canonical_name(match.group(1))
        if name in seen:
            problems.append(f"{source}:{number}: {name} is locked twice (first on line {seen[name]})")
        seen[name] = number
        bad = [option for option in options if not HASH_OPTION.match(option)]
        if bad:
            problems.append(f"{source}:{number}: {name}: not a --hash=sha256:<64 hex> option: {bad[0]!r}")
        if not any(HASH_OPTION.match(option) for option in options):
            problems.append(f"{source}:{number}: {name}=={match.group(2)} has no --hash=sha256:")
    return problems


def parse_lock(text: str, *, source: str = "<lock>") -> dict[str, Pin]:
    """Canonical name → Pin; ContainerError with every problem if the lock is not fully pinned."""
    problems = lock_problems(text, source=source)
    if problems:
        raise ContainerError(first_problem(problems))
    pins = {}
    for number, line in _logical_lines(text):
        requirement, *options = line.split()
        name, version = PIN.match(requirement).groups()
        hashes = tuple(HASH_OPTION.match(option).group(1) for option in options)
        pins[canonical_name(name)] = Pin(canonical_name(name), version, hashes, number)
    return pins


def read_lock(path: Path | str) -> dict[str, Pin]:
    path = Path(path)
    return parse_lock(path.read_text(encoding="utf-8"), source=str(path))


def installed_labels(dists: list[str]) -> str:
    """`parity.installed.DIST VERSION` label lines, read from the environment that runs it (`none` where a dist
    is not installed): what an image holds, beside its `version.*` labels, which name the full lock's pins even
    in an image built from a part of it (build.sh --lock, e.g. the CPU part without vLLM and torch)."""
    import importlib.metadata

    lines = []
    for dist in dists:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "none"
        lines.append(f"parity.installed.{dist} {version}\n")
    return "".join(lines)


def lock_subset(text: str, names: list[str]) -> str:
    """The lock's entries for `names` only, hashes kept: what `%post` installs before the rest.

    Building an sdist or the project with --no-build-isolation needs its build backend installed
    first; taking those pins from the same lock keeps them hash-checked.
    """
    pins = parse_lock(text)
    missing = [name for name in names if canonical_name(name) not in pins]
    if missing:
        raise ContainerError(f"not in the lock: {', '.join(missing)}")
    out = []
    for name in names:
        pin = pins[canonical_name(name)]
        out.append(" \\\n".join([f"{pin.name}=={pin.version}"] + [f"    --hash=sha256:{h}" for h in pin.hashes]))
    return "\n".join(out) + "\n"


def lock_part(text: str, names: list[str], backends: list[str], what: str) -> str:
    """A part of the lock for an image that needs less than all of it (`containers/build.sh --lock`, e.g. the CPU
    smoke image without vLLM and torch): `names` and the build backends `%post` installs first (`backends`,
    read from the def: `build_backends`), every pin and hash copied from the full lock; `what` heads it."""
    wanted = sorted({canonical_name(name) for name in [*names, *backends]})
    header = [f"# {line}" for line in what.splitlines()]
    header.append(f"# {len(wanted)} of the {len(parse_lock(text))} pins of containers/requirements.lock, each with its "
                  f"hashes as they are there; do not edit by hand.")
    return "\n".join(header) + "\n" + lock_subset(text, wanted)


def sdist_build_requirements(text: str) -> dict[str, list[str]]:
    """Canonical name → the [build-system] requires of each sdist in the lock, from its note.

    `%post` builds sdists with --no-build-isolation, so these must be installed (from the lock)
    before the lock itself; a pin without its note is an sdist the check cannot see, so it is an error.
    """
    notes = {}
    for raw in text.splitlines():
        match = SDIST_NOTE.match(raw.strip())
        if match:
            notes[canonical_name(match.group(1))] = [r.strip() for r in match.group(2).split(",") if r.strip()]
    unnoted = [raw.split(":", 1)[0][2:] for raw in text.splitlines()
               if raw.startswith("# ") and ": sdist only" in raw and "build requires:" not in raw]
    if unnoted:
        raise ContainerError(f"lock: sdist without a 'build requires:' note: {', '.join(unnoted)}")
    return notes


def build_backends(stage: Stage) -> list[str]:
    """The names `%post` installs from the lock before the rest (its `lock_subset` command)."""
    for command in _joined_lines(stage.lines("post")):
        if "lock_subset" in command and " /opt/parity/requirements.lock " in command:
            return command.split(" /opt/parity/requirements.lock ", 1)[1].split(">", 1)[0].split()
    return []


def sdist_build_problems(lock_text: str, stages: list[Stage]) -> list[str]:
    """Build requirements of the lock's sdists that the lock lacks or `%post` does not install first; [] if none.

    Versions are not compared here (standard library only); tests/test_container.py checks them.
    """
    pins = parse_lock(lock_text)
    first = {canonical_name(name) for name in build_backends(final_stage(stages))}
    problems = []
    for sdist, requirements in sorted(sdist_build_requirements(lock_text).items()):
        for requirement in requirements:
            name = canonical_name(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
            if name not in pins:
                problems.append(f"{sdist}'s sdist builds with {requirement}, which the lock lacks")
            elif name not in first:
                problems.append(f"{sdist}'s sdist builds with {requirement}, which %post does not install before the lock")
    return problems


# ---- agreement between the def file and the lock -----------------------------------------------

def final_stage(stages: list[Stage]) -> Stage:
    """The stage that becomes the image: the last one."""
    return stages[-1]


def version_disagreements(stages: list[Stage], pins: dict[str, Pin]) -> list[str]:
    """Where `%test` expectations or `%labels` name a version the lock does not hold.

    `%test` may add a local label the wheel's metadata lacks (torch reports 2.13.0+cu130 from a
    wheel whose metadata says 2.13.0), so the public part is compared. A `version.<dist>` label
    must equal the locked version exactly.
    """
    final = final_stage(stages)
    problems = []
    for dist, (_module, version) in final.expectations().items():
        pin = pins.get(canonical_name(dist))
        if pin is None:
            continue  # the project itself is not in the lock; the caller checks it against pyproject
        if version.split("+", 1)[0] != pin.version:
            problems.append(f"%test expects {dist} {version}, the lock has {pin.version}")
    for label, value in final.labels().items():
        if label.startswith("version."):
            dist = label[len("version."):]
            pin = pins.get(canonical_name(dist))
            if pin is not None and value.split("+", 1)[0] != pin.version:
                problems.append(f"%labels says {label} {value}, the lock has {pin.version}")
    return problems


# ---- the image manifest ------------------------------------------------------------------------

def image_manifest(sif: Path | str, definition: Path | str, lock: Path | str, manifest_path: Path | str,
                   *, sif_sha256: str | None = None, tested: bool, apptainer_version: str | None,
                   build_args: dict[str, str] | None = None, route: str = "build") -> dict:
    """The evidence for one built image: its SHA-256, and the def and lock it was built from, by hash.

    The SIF is recorded by name, hash and size but not as a file link: it is gigabytes, lives outside
    the repository, and a checkout without it must still validate. The def and lock are file links,
    so an edit after the build shows up as a hash mismatch in `parity validate`. `variant` is the
    final stage's `parity.variant` label: "reviewers" for the digest-pinned bases, "offline" for a
    build from local bases (containers/build.sh --variant offline), whose stages name local paths.
    """
    from parity import manifest

    sif = Path(sif)
    stages = read_definition(definition, build_args)
    pins = read_lock(lock)
    folder = Path(manifest_path).parent
    return manifest.header("image", simulated=False) | {
        "image": {"name": sif.name, "sha256": sif_sha256 or manifest.sha256_file(sif), "bytes": sif.stat().st_size},
        "definition": manifest.file_ref(definition, folder),
        "lock": manifest.file_ref(lock, folder),
        "stages": [{"stage": stage.name or str(index), "bootstrap": stage.headers.get("Bootstrap", ""),
                    "from": stage.base or ""} for index, stage in enumerate(stages)],
        "pins": {dist: pins[canonical_name(dist)].version
                 for dist in final_stage(stages).expectations() if canonical_name(dist) in pins},
        "variant": final_stage(stages).labels().get("parity.variant", "reviewers"),
        "build_args": dict(sorted((build_args or {}).items())),
        "route": route,
        "tested": bool(tested),
        "apptainer_version": apptainer_version,
        "built_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_image_manifest(sif: Path | str, definition: Path | str, lock: Path | str, out: Path | str,
                         **kwargs) -> dict:
    """Build the image manifest and write it, validated, atomically; returns the written file's reference."""
    from parity import manifest

    return manifest.write_manifest(out, image_manifest(sif, definition, lock, out, **kwargs))
