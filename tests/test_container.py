"""The pinned image, audited offline: digest-pinned bases, a complete hash lock, and versions that agree.

CI has no Apptainer and no Docker registry, so these tests read the recipe rather than build it. Each
rule also has a negative test on a deliberately broken copy. The few that need Apptainer find it on
PATH (built by hand, outside the repository) and skip plainly without it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import parity
from parity import container
from parity.container import (
    ContainerError,
    canonical_name,
    definition_problems,
    final_stage,
    lock_problems,
    lock_subset,
    parse_definition,
    parse_lock,
    read_definition,
    read_lock,
    render_definition,
    sdist_build_problems,
    sdist_build_requirements,
    split_post,
    version_disagreements,
    write_image_manifest,
)
from parity.manifest import known_kinds, read_manifest, validate_document, validate_paths

ROOT = Path(__file__).resolve().parents[1]
DEF = ROOT / "containers" / "parity.def"
LOCK = ROOT / "containers" / "requirements.lock"
REQUIREMENTS_IN = ROOT / "containers" / "requirements.in"
BUILD = ROOT / "containers" / "build.sh"

# The study's pins (vllm.md, flame.md, mlperf.md in the project's reference sheets).
STUDY_PINS = {"vllm": "0.28.0", "torch": "2.13.0", "flamepy": "0.6.0", "mlcommons-loadgen": "5.1.1"}
# linux/amd64 digests from Flame's docs/releases/v0.6.0.md.
FLAME_IMAGES = {
    "fsm": "docker.io/xflops/flame-session-manager:v0.6.0"
           "@sha256:5f2e9c56d09bf50bd838781e753597bc8a49289a97a578a0c2603166f506dbbb",
    "fem": "docker.io/xflops/flame-executor-manager:v0.6.0"
           "@sha256:f9bef1492cefd61b130c5208aca3ed626d9ae5436600188e392663aa01972477",
}
FLAME_BINARIES = {"fsm": "/usr/local/flame/bin/flame-session-manager",
                  "fem": "/usr/local/flame/bin/flame-executor-manager"}
# What containers/build.sh --variant offline passes as --build-arg (paths made by containers/offline-base.sh).
OFFLINE_ARGS = {"BOOTSTRAP": "localimage", "BASE_IMAGE": "/b/rootfs", "FSM_IMAGE": "/b/flame", "FEM_IMAGE": "/b/flame",
                "VARIANT": "offline", "PYTHON_SOURCE": "org.bytedeco:cpython:3.12.1-1.5.10:jar:linux-x86_64 sha256:" + "a" * 64}
APPTAINER = shutil.which("apptainer")
needs_apptainer = pytest.mark.skipif(APPTAINER is None, reason="apptainer is not on PATH (CI has none)")
# Hashes published independently of PyPI's index: Flame's release notes and the MLPerf sheet.
REFERENCE_HASHES = {
    "flamepy": "0b4b34152b1d27d14ba1313d3970379822967fbc26a0aa5cf096ef1163ec7c54",
    "mlcommons-loadgen": "d63e2bb2bf0f7547b1424df3c6c882f5fa0880e8a7641f42565412fe22b3e7d9",
}


@pytest.fixture(scope="module")
def stages():
    return read_definition(DEF)


@pytest.fixture(scope="module")
def final(stages):
    return final_stage(stages)


@pytest.fixture(scope="module")
def pins():
    return read_lock(LOCK)


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _joined(lines: list[str]) -> list[str]:
    """Script lines with backslash continuations joined."""
    out, current = [], ""
    for line in lines:
        if line.endswith("\\"):
            current += line[:-1] + " "
        else:
            out.append(current + line)
            current = ""
    return out


def range_violations(pyproject: dict, pins: dict) -> list[str]:
    """Requirements of pyproject.toml (runtime, gpu, workflow) that the lock misses or does not satisfy."""
    project = pyproject["project"]
    declared = project["dependencies"] + [r for extra in ("gpu", "workflow")
                                          for r in project["optional-dependencies"][extra]]
    problems = []
    for text in declared:
        requirement = Requirement(text)
        pin = pins.get(canonical_name(requirement.name))
        if pin is None:
            problems.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(Version(pin.version), prereleases=True):
            problems.append(f"{requirement.name}=={pin.version} is outside pyproject's {requirement.specifier}")
    return problems


# ---- the def file ------------------------------------------------------------------------------

def test_bootstrap_is_the_first_line():
    text = DEF.read_text(encoding="utf-8")
    assert text.splitlines()[0] == "Bootstrap: {{ BOOTSTRAP }}"
    assert render_definition(text).splitlines()[0] == "Bootstrap: docker"


def test_bases_are_build_arguments_defaulting_to_the_pinned_ones(stages):
    """Every stage's Bootstrap and From are `{{ }}` arguments; each stage's %arguments holds its default."""
    text = DEF.read_text(encoding="utf-8")
    assert text.count("Bootstrap: {{ BOOTSTRAP }}") == 3 and "{{ BASE_IMAGE }}" in text
    assert [stage.headers["Bootstrap"] for stage in stages] == ["docker"] * 3
    assert all(stage.lines("arguments") for stage in stages)
    assert final_stage(stages).labels()["parity.variant"] == "reviewers"


def test_the_offline_variant_says_so_and_keeps_post_test_and_lock(stages):
    offline = read_definition(DEF, OFFLINE_ARGS)
    final = final_stage(offline)
    assert [(s.headers["Bootstrap"], s.base) for s in offline] == [
        ("localimage", "/b/flame"), ("localimage", "/b/flame"), ("localimage", "/b/rootfs")]
    labels = final.labels()
    assert labels["parity.variant"] == "offline" and labels["parity.base"] == "/b/rootfs"
    assert labels["parity.python"] == OFFLINE_ARGS["PYTHON_SOURCE"]
    assert dict(read_definition(DEF, {"LOCK": "/l/cpu.lock"})[-1].files())["/l/cpu.lock"] == "/opt/parity/requirements.lock"
    for section in ("post", "test", "files", "environment", "runscript"):
        assert final.lines(section) == final_stage(stages).lines(section), section
    assert any("not pinned" in p for p in definition_problems(offline))  # never mistaken for the reviewers' recipe


def test_build_arguments_follow_apptainer(tmp_path):
    text = "Bootstrap: {{ B }}\nFrom: {{ F }}\n%arguments\n    B=docker\n    F=x@sha256:" + "0" * 64 + "\n" \
           "%post\n    # {{ NOT_AN_ARGUMENT }} in a comment is left alone\n    echo {{B}}\n"
    assert "echo docker" in render_definition(text) and "{{ NOT_AN_ARGUMENT }}" in render_definition(text)
    assert "From: y" in render_definition(text, {"F": "y"})
    with pytest.raises(ContainerError, match="build argument MISSING has no value"):
        render_definition(text + "    echo {{ MISSING }}\n")
    # a default is the stage's own, as in Apptainer: a second stage does not see the first's
    with pytest.raises(ContainerError, match="build argument B has no value"):
        render_definition(text + "Bootstrap: {{ B }}\nFrom: z\n")


def test_python_comes_from_apt_unless_the_base_brings_3_12(final):
    post = "\n".join(_joined(final.lines("post")))
    assert "if ! command -v python3.12" in post
    apt = [cmd for cmd in _joined(final.lines("post")) if "apt-get install" in cmd]
    assert "python3-venv" in apt[1] and "python3" not in apt[0].split()


def test_host_ca_hook_is_off_by_default(final):
    """pip gets PIP_CERT only when a non-empty CA bundle was bound at the mount point %setup makes."""
    assert 'touch "${APPTAINER_ROOTFS}/etc/parity-host-ca.crt"' in final.lines("setup")
    post = final.lines("post")
    hook = next(i for i, line in enumerate(post) if "PIP_CERT" in line)
    assert post[hook] == "if [ -s /etc/parity-host-ca.crt ]; then export PIP_CERT=/etc/parity-host-ca.crt; fi"
    assert hook < next(i for i, line in enumerate(post) if "pip install" in line)
    assert "PIP_CERT" not in "\n".join(final.lines("environment"))


def test_split_post_leaves_every_other_section():
    text = render_definition(DEF.read_text(encoding="utf-8"))
    without, post = split_post(text)
    before, after = parse_definition(text), parse_definition(without)
    assert "post" in before[-1].sections and "post" not in after[-1].sections
    for old, new in zip(before, after):
        assert {k: v for k, v in old.sections.items() if k != "post"} == new.sections
    assert post.splitlines()[0].strip() == "set -eu" and post.rstrip().endswith('>> "$APPTAINER_LABELS"')


def test_every_stage_is_pinned_by_digest(stages):
    assert definition_problems(stages) == []
    assert [stage.name for stage in stages] == ["fsm", "fem", "final"]
    for stage in stages:
        assert re.search(r"@sha256:[0-9a-f]{64}$", stage.base), stage.base


def test_flame_stages_are_the_v060_release_images(stages, final):
    by_name = {stage.name: stage for stage in stages}
    for name, image in FLAME_IMAGES.items():
        assert by_name[name].base == image
        sources = [source for source, _ in final.files(name)]
        assert sources == [FLAME_BINARIES[name]]
        destination = final.files(name)[0][1]
        assert destination == "/usr/local/bin/" + Path(FLAME_BINARIES[name]).name


def test_final_stage_is_a_cuda13_runtime_on_ubuntu_2404(final):
    assert re.fullmatch(r"docker\.io/nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu24\.04@sha256:[0-9a-f]{64}", final.base)
    assert final.labels()["parity.base"] == final.base


def test_host_files_exist_and_the_lock_is_the_one_tested(final):
    pairs = final.files()
    for source, _ in pairs:
        assert (ROOT / source).exists(), source
    assert dict(pairs)["containers/requirements.lock"] == "/opt/parity/requirements.lock"


def test_post_installs_only_hash_locked_packages(final):
    installs = [cmd for cmd in _joined(final.lines("post")) if re.search(r"\bpip install\b", cmd)]
    assert len(installs) == 3
    build_backends, locked, project = installs
    for cmd in (build_backends, locked):
        assert "--require-hashes" in cmd.split() and "--no-deps" in cmd.split()
    assert "-r /opt/parity/requirements.lock" in locked
    assert "--no-build-isolation" in locked.split()
    assert project.split()[-1] == "/opt/parity/src"
    assert {"--no-index", "--no-deps", "--no-build-isolation"} <= set(project.split())


def test_a_part_of_the_lock_copies_its_pins_and_the_build_backends(final):
    """containers/lock.py --part-cpu writes what a part needs (resolved by pip) through lock_part: each pin and its
    hashes as the full lock has them, with the backends %post installs first; a name the lock lacks is refused."""
    text = LOCK.read_text(encoding="utf-8")
    backends = container.build_backends(final)
    part_text = container.lock_part(text, ["Click", "flamepy"], backends, "a test part\nof two lines")
    assert part_text.startswith("# a test part\n# of two lines\n# ")
    part, full = parse_lock(part_text), parse_lock(text)
    assert set(part) == {"click", "flamepy"} | {container.canonical_name(b) for b in backends}
    assert all(part[name].hashes == full[name].hashes and part[name].version == full[name].version for name in part)
    with pytest.raises(container.ContainerError, match="not in the lock: no-such-dist"):
        container.lock_part(text, ["no-such-dist"], backends, "x")


def test_build_backends_installed_first_are_in_the_lock(final):
    text = LOCK.read_text(encoding="utf-8")
    command = next(cmd for cmd in _joined(final.lines("post")) if "lock_subset" in cmd)
    names = command.split("/opt/parity/requirements.lock", 1)[1].split(">", 1)[0].split()
    assert {"setuptools", "hatchling"} <= set(names)
    subset = parse_lock(lock_subset(text, names))
    full = parse_lock(text)
    assert {name: full[name].hashes for name in subset} == {name: pin.hashes for name, pin in subset.items()}


def test_test_section_checks_the_study_versions(final, pins, pyproject):
    expected = final.expectations()
    assert set(expected) == {"vllm", "torch", "flamepy", "mlcommons-loadgen", "snakemake", "parity"}
    assert expected["torch"] == ("torch", "2.13.0+cu130")
    assert expected["mlcommons-loadgen"][0] == "mlperf_loadgen"
    for dist, version in STUDY_PINS.items():
        assert expected[dist][1].split("+")[0] == version
    assert expected["snakemake"][1] == pins["snakemake"].version
    assert expected["parity"][1] == pyproject["project"]["version"] == parity.__version__


def test_the_reviewers_image_checks_every_expectation(final, pins):
    """%test skips a dist its image's lock does not pin (a part lock's image, e.g. the CPU smoke image without vLLM
    and torch), so the committed lock must pin every dist %test expects, parity (installed from source) aside: the
    reviewers' image, built from it, then checks every line, vLLM's and torch's imports and CUDA included."""
    assert {d for d in final.expectations() if d != "parity"} <= set(pins)
    test = "\n".join(final.lines("test"))
    assert 'pinned() { [ "$1" = parity ] || grep -qi "^$1==" /opt/parity/requirements.lock; }' in test
    assert "if pinned torch; then" in test and "if pinned vllm; then" in test


def test_test_section_and_labels_agree_with_the_lock(stages, final, pins, pyproject):
    assert version_disagreements(stages, pins) == []
    labels = final.labels()
    for dist, (_module, version) in final.expectations().items():
        assert labels[f"version.{dist}"] == version
    assert labels["version.parity"] == pyproject["project"]["version"]


def test_post_labels_the_installed_lock_by_hash(final):
    """An image built with another lock (build.sh --lock) says so: its label differs from the committed lock's hash."""
    post = final.lines("post")
    assert 'echo "parity.lock_sha256 $(sha256sum /opt/parity/requirements.lock | cut -d\' \' -f1)" >> "$APPTAINER_LABELS"' in post


def test_post_labels_what_is_installed_of_every_dist_a_version_label_names(final):
    """The version.* labels name the full lock's pins; an image built from a part of the lock (the CPU part, no vLLM
    or torch) says what it holds in parity.installed.* labels, read from its own environment: `none` for a dist
    it lacks."""
    import importlib.metadata

    from parity.container import installed_labels

    post = " ".join(final.lines("post"))
    call = re.search(r"installed_labels\(sys\.argv\[1:\]\)\)' \\? ?((?:[\w-]+ )+)>> \"\$APPTAINER_LABELS\"", post)
    assert call, "the %post line that labels what is installed"
    named = {label[len("version."):] for label in final.labels() if label.startswith("version.")}
    assert set(call.group(1).split()) == named
    assert installed_labels(["numpy", "surely-not-a-dist"]) == (f"parity.installed.numpy {importlib.metadata.version('numpy')}\n"
                                                              "parity.installed.surely-not-a-dist none\n")


def test_runscript_runs_parity_and_environment_pins_the_hash_seed(final):
    assert re.fullmatch(r'exec (\S*/)?parity "\$@"', " ".join(final.lines("runscript")))
    environment = "\n".join(final.lines("environment"))
    assert 'PATH="/opt/venv/bin:' in environment
    assert "PYTHONHASHSEED" in environment


# ---- the lock ----------------------------------------------------------------------------------

def test_lock_pins_every_requirement_with_a_hash(pins):
    assert lock_problems(LOCK.read_text(encoding="utf-8")) == []
    assert len(pins) > 100  # the full transitive closure of vLLM, not just the top level
    for pin in pins.values():
        assert pin.hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in pin.hashes)


def test_lock_has_the_study_pins(pins):
    for dist, version in STUDY_PINS.items():
        assert pins[dist].version == version
    assert Version(pins["snakemake"].version).major == 9
    # vLLM excludes protobuf 6.30-6.33.4 and flamepy needs >=6.31 (flame.md), so only >=6.33.5 fits both.
    assert Version(pins["protobuf"].version) >= Version("6.33.5")


def test_lock_hashes_match_independently_published_ones(pins):
    for dist, sha in REFERENCE_HASHES.items():
        assert sha in pins[dist].hashes


def test_pyproject_ranges_admit_the_locked_versions(pyproject, pins):
    assert range_violations(pyproject, pins) == []


def test_requirements_in_is_satisfied_by_the_lock(pins):
    for line in REQUIREMENTS_IN.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        pin = pins[canonical_name(requirement.name)]
        assert requirement.specifier.contains(Version(pin.version), prereleases=True), (line, pin.version)


def test_every_sdist_has_its_build_requirements_locked_and_installed_first(stages, pins):
    """%post builds sdists with --no-build-isolation: what each builds with must be in the lock, at a version
    it accepts, and installed before the lock. bagit 1.9.0 builds with setuptools-scm, once missing."""
    text = LOCK.read_text(encoding="utf-8")
    noted = sdist_build_requirements(text)
    sdists = {canonical_name(line.split(":")[0][2:]) for line in text.splitlines() if ": sdist only" in line}
    assert set(noted) == sdists == {"bagit", "connection-pool", "rouge-score"}
    assert sdist_build_problems(text, stages) == []
    for sdist, requirements in noted.items():
        for line in requirements:
            requirement = Requirement(line)
            pin = pins[canonical_name(requirement.name)]
            assert requirement.specifier.contains(Version(pin.version)), (sdist, line, pin.version)
    assert "setuptools-scm" in noted["bagit"][1]


def test_setuptools_scm_fits_the_locked_packaging(pins):
    """setuptools-scm 9.2.2 needs packaging>=20 and setuptools (10.x needs vcs-versioning, which needs
    packaging>=26.2: pip check would fail against the lock's packaging)."""
    assert pins["setuptools-scm"].version == "9.2.2"
    assert Version(pins["packaging"].version) >= Version("20") and "setuptools" in pins
    assert Version(pins["packaging"].version) < Version("26.2")


def test_a_lock_without_an_sdists_build_requirement_fails(stages):
    text = LOCK.read_text(encoding="utf-8")
    old = "setuptools-scm==9.2.2 \\\n    --hash=sha256:30e8f84d2ab1ba7cb0e653429b179395d0c33775d54807fc5f1dd6671801aef7\n"
    assert old in text
    problems = sdist_build_problems(text.replace(old, ""), stages)
    assert problems == ["bagit's sdist builds with setuptools-scm>=8, which the lock lacks"]
    broken = _broken_def_text("trove-classifiers setuptools-scm", "trove-classifiers")
    assert sdist_build_problems(text, broken) == [
        "bagit's sdist builds with setuptools-scm>=8, which %post does not install before the lock"]
    unnoted = text.replace("; build requires: setuptools>=64, setuptools-scm>=8", "")
    with pytest.raises(ContainerError, match="sdist without a 'build requires:' note: bagit"):
        sdist_build_requirements(unnoted)


def _broken_def_text(old: str, new: str) -> list:
    text = DEF.read_text(encoding="utf-8")
    assert old in text
    return parse_definition(render_definition(text.replace(old, new, 1)))


def test_lock_has_no_unverified_pins():
    assert "UNVERIFIED" not in LOCK.read_text(encoding="utf-8")


# ---- negative cases: broken copies must fail ---------------------------------------------------

def _broken_def(tmp_path: Path, old: str, new: str) -> list:
    text = DEF.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "broken.def"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return read_definition(path)


def test_an_unpinned_base_image_fails(tmp_path, stages):
    cuda = final_stage(stages).base
    broken = _broken_def(tmp_path, cuda, cuda.split("@")[0])
    problems = definition_problems(broken)
    assert len(problems) == 1 and "not pinned by @sha256" in problems[0]


def test_a_short_or_uppercase_digest_fails(tmp_path):
    broken = _broken_def(tmp_path, "@sha256:5f2e9c56", "@sha256:5F2E9C56")
    assert any("stage fsm" in p for p in definition_problems(broken))
    broken = _broken_def(tmp_path, "5f2e9c56d09bf50bd838781e753597bc8a49289a97a578a0c2603166f506dbbb", "5f2e9c56")
    assert any("stage fsm" in p for p in definition_problems(broken))


def test_a_pip_install_without_hashes_fails(tmp_path):
    broken = _broken_def(tmp_path, "    /opt/venv/bin/pip check\n",
                         "    /opt/venv/bin/pip install vllm\n    /opt/venv/bin/pip check\n")
    problems = definition_problems(broken)
    assert any("without --no-deps" in p for p in problems)
    assert any("neither --require-hashes nor --no-index" in p for p in problems)


def test_a_version_that_disagrees_with_the_lock_fails(tmp_path, pins):
    broken = _broken_def(tmp_path, "expect vllm vllm 0.28.0", "expect vllm vllm 0.27.0")
    assert version_disagreements(broken, pins) == ["%test expects vllm 0.27.0, the lock has 0.28.0"]
    broken = _broken_def(tmp_path, "version.flamepy 0.6.0", "version.flamepy 0.5.0")
    assert version_disagreements(broken, pins) == ["%labels says version.flamepy 0.5.0, the lock has 0.6.0"]


def test_a_lock_outside_pyproject_ranges_fails(pyproject, pins):
    moved = dict(pins) | {"vllm": container.Pin("vllm", "0.29.0", pins["vllm"].hashes, 0)}
    assert range_violations(pyproject, moved) == ["vllm==0.29.0 is outside pyproject's <0.29,>=0.26.0"]
    missing = {name: pin for name, pin in pins.items() if name != "flamepy"}
    assert range_violations(pyproject, missing) == ["flamepy is not in the lock"]


HASH = "--hash=sha256:" + "a" * 64


@pytest.mark.parametrize(("lock", "why"), [
    (f"vllm>=0.28.0 {HASH}\n", "not pinned to one exact version"),
    ("vllm\n", "not pinned to one exact version"),
    ("vllm==0.28.0\n", "has no --hash=sha256:"),
    ("vllm==0.28.0 --hash=md5:abc\n", "not a --hash=sha256:<64 hex> option"),
    (f"vllm==0.28.0 --hash=sha256:{'a' * 63}\n", "not a --hash=sha256:<64 hex> option"),
    (f"vllm==0.28.0 {HASH}\nVLLM==0.28.0 {HASH}\n", "locked twice"),
    (f"-e ./src\nvllm==0.28.0 {HASH}\n", "option '-e' outside a requirement"),
    (f"--extra-index-url https://example.invalid/simple\nvllm==0.28.0 {HASH}\n", "outside a requirement"),
    (f"# UNVERIFIED: no hash could be checked\ntorch==2.13.0+cu130 {HASH}\n", "marked UNVERIFIED"),
])
def test_an_unpinned_lock_fails(tmp_path, lock, why):
    path = tmp_path / "requirements.lock"
    path.write_text(lock, encoding="utf-8")
    problems = lock_problems(path.read_text(), source=str(path))
    assert problems and why in problems[0], problems
    with pytest.raises(ContainerError, match=re.escape(why)):
        read_lock(path)


def test_lock_continuations_and_comments_parse():
    text = f"# header\n\nvllm==0.28.0 \\\n    {HASH} \\\n    --hash=sha256:{'b' * 64}\n    # via x\nclick==8.1.8 {HASH}\n"
    pins = parse_lock(text)
    assert pins["vllm"].hashes == ("a" * 64, "b" * 64)
    assert pins["click"].version == "8.1.8"
    assert parse_lock(lock_subset(text, ["vllm"])) == {"vllm": container.Pin("vllm", "0.28.0", pins["vllm"].hashes, 1)}
    with pytest.raises(ContainerError, match="not in the lock: numpy"):
        lock_subset(text, ["numpy"])


def test_malformed_definitions_are_refused():
    with pytest.raises(ContainerError, match="before any Bootstrap"):
        parse_definition("%post\n    true\n")
    with pytest.raises(ContainerError, match="expected a 'Keyword: value' header"):
        parse_definition("Bootstrap: docker\nFrom ubuntu\n")
    with pytest.raises(ContainerError, match="no Bootstrap"):
        parse_definition("# nothing\n")
    stages = parse_definition("Bootstrap: docker\nFrom: ubuntu:24.04\nBootstrap: oras\nFrom: x@sha256:" + "0" * 64 + "\n")
    problems = definition_problems(stages)
    assert any("not pinned" in p for p in problems)
    assert any("Bootstrap must be docker" in p for p in problems)
    assert any("needs Stage:" in p for p in problems)


def test_script_lines_that_look_like_sections_stay_in_their_section():
    stages = parse_definition("Bootstrap: docker\nFrom: a@sha256:" + "0" * 64 + "\n%post\n"
                              "    printf '%files\\n'\n    %test is not a section when indented\n%test\n    true\n")
    assert stages[0].lines("post") == ["printf '%files\\n'", "%test is not a section when indented"]
    assert stages[0].lines("test") == ["true"]


# ---- the image manifest and the build script ---------------------------------------------------

def _image_doc(tmp_path: Path) -> tuple[dict, Path]:
    sif = tmp_path / "parity.sif"
    sif.write_bytes(b"not really a SIF")
    out = tmp_path / "manifests" / "image.json"
    ref = write_image_manifest(sif, DEF, LOCK, out, tested=False, apptainer_version="apptainer version 1.4.5")
    assert Path(ref["path"]) == out
    return read_manifest(out), out


def test_image_manifest_validates_and_links_the_recipe_by_hash(tmp_path):
    assert "image" in known_kinds()  # schemas/image.schema.json is discovered like every other kind
    doc, out = _image_doc(tmp_path)
    assert doc["kind"] == "image" and doc["simulated"] is False
    assert doc["image"]["name"] == "parity.sif" and doc["image"]["bytes"] == len(b"not really a SIF")
    assert doc["pins"]["vllm"] == "0.28.0" and doc["pins"]["torch"] == "2.13.0"
    assert [s["stage"] for s in doc["stages"]] == ["fsm", "fem", "final"]
    assert (doc["variant"], doc["build_args"], doc["route"]) == ("reviewers", {}, "build")
    assert validate_paths([out]) == (1, [])


def test_the_offline_image_manifest_says_so(tmp_path):
    sif = tmp_path / "parity-offline.sif"
    sif.write_bytes(b"offline")
    out = tmp_path / "manifests" / "image.json"
    write_image_manifest(sif, DEF, LOCK, out, tested=False, apptainer_version="apptainer version 1.5.3",
                         build_args=OFFLINE_ARGS, route="sandbox")
    doc = read_manifest(out)
    assert doc["variant"] == "offline" and doc["route"] == "sandbox" and doc["build_args"] == OFFLINE_ARGS
    assert [(s["bootstrap"], s["from"]) for s in doc["stages"]][-1] == ("localimage", "/b/rootfs")
    assert validate_paths([out]) == (1, [])
    doc["variant"] = "reviewers"  # local bases under the reviewers' name: refused
    assert {p.rule for p in validate_document(doc)} == {"const", "pattern"}


def test_image_manifest_schema_rejects_an_unpinned_stage(tmp_path):
    doc, _ = _image_doc(tmp_path)
    doc["stages"][2]["from"] = "docker.io/nvidia/cuda:13.0.1-runtime-ubuntu24.04"
    problems = validate_document(doc)
    assert [(p.pointer, p.rule) for p in problems] == [("/stages/2/from", "pattern")]


def test_build_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(BUILD)], check=True)
    assert os.access(BUILD, os.X_OK)


def test_build_script_records_the_image_with_a_stand_in_apptainer(tmp_path):
    """A fake `apptainer` on PATH writes the SIF; the script must hash it and write a valid manifest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "apptainer version 0.0.0-fake"; exit 0; fi\n'
                    'echo "$@" > "$FAKE_LOG"\n'
                    'eval "sif=\\${$(($# - 1))}"\nprintf "sif bytes" > "$sif"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    sif, manifest_path = tmp_path / "out" / "parity.sif", tmp_path / "manifests" / "image.json"
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
                        "FAKE_LOG": str(tmp_path / "apptainer.log")}
    result = subprocess.run([str(BUILD), "--route", "build", "--notest", "--out", str(sif), "--manifest",
                             str(manifest_path), "--", "--fakeroot"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apptainer.log").read_text().split() == [
        "build", "--force", "--notest", "--fakeroot", str(sif), "containers/parity.def"]
    doc = read_manifest(manifest_path)
    assert doc["image"]["sha256"] == hashlib.sha256(b"sif bytes").hexdigest()
    assert doc["tested"] is False and doc["apptainer_version"] == "apptainer version 0.0.0-fake"
    assert validate_paths([manifest_path]) == (1, [])


def _fake_apptainer(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "apptainer version 0.0.0-fake"; exit 0; fi\n'
                    'echo "$@" >> "$FAKE_LOG"\neval "sif=\\${$(($# - 1))}"\nprintf "sif bytes" > "$sif"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
                         "FAKE_LOG": str(tmp_path / "apptainer.log")}


def test_build_script_offline_variant_and_host_ca(tmp_path):
    """--variant offline passes the local bases as --build-arg; --host-ca binds the bundle; the manifest says offline."""
    base = tmp_path / "base"
    (base / "rootfs" / "opt" / "python3.12" / "bin").mkdir(parents=True)
    (base / "rootfs" / "opt" / "python3.12" / "bin" / "python3.12").write_text("")
    (base / "flame" / "usr" / "local" / "flame" / "bin").mkdir(parents=True)
    (base / "flame" / "usr" / "local" / "flame" / "bin" / "flame-session-manager").write_text("")
    ca = tmp_path / "ca.crt"
    ca.write_text("pem")
    sif, manifest_path = tmp_path / "out" / "offline.sif", tmp_path / "manifests" / "image.json"
    result = subprocess.run([str(BUILD), "--variant", "offline", "--base-dir", str(base), "--host-ca", str(ca),
                             "--lock", str(LOCK),
                             "--route", "build", "--notest", "--out", str(sif), "--manifest", str(manifest_path)],
                            env=_fake_apptainer(tmp_path), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "apptainer.log").read_text().split()
    assert argv[:3] == ["build", "--force", "--notest"] and argv[-2:] == [str(sif), "containers/parity.def"]
    assert f"BASE_IMAGE={base}/rootfs" in argv and "VARIANT=offline" in argv and "BOOTSTRAP=localimage" in argv
    assert argv[argv.index("--bind") + 1] == f"{ca}:/etc/parity-host-ca.crt"
    assert f"LOCK={LOCK}" in argv  # --lock reaches %files through the LOCK build argument
    doc = read_manifest(manifest_path)
    assert doc["variant"] == "offline" and doc["stages"][-1]["from"] == f"{base}/rootfs"


def test_build_script_refuses_bad_variants_and_routes(tmp_path):
    env = _fake_apptainer(tmp_path)
    for args, why in ((["--variant", "offline"], "needs --base-dir"), (["--variant", "gpu"], "must be reviewers or offline"),
                      (["--base-dir", "x"], "--base-dir is for --variant offline"),
                      (["--route", "fast", "--out", str(tmp_path / "x.sif")], "--route must be build or sandbox")):
        result = subprocess.run([str(BUILD), *args], env=env, capture_output=True, text=True)
        assert result.returncode == 2 and why in result.stderr, (args, result.stderr)


def test_build_script_refuses_without_apptainer(tmp_path):
    if shutil.which("apptainer"):
        pytest.skip("apptainer is installed here")
    env = os.environ | {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    result = subprocess.run([str(BUILD)], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "apptainer is not installed" in result.stderr


# ---- what the workflow's jobs import, the image holds ------------------------------------------

# Modules of the GPU extra, not installed on a CPU machine: their distributions by name.
GPU_MODULES = {"vllm": "vllm", "torch": "torch"}


def third_party_imports(package: Path) -> set[str]:
    """Top-level modules that any module of the package imports, other than the standard library and itself."""
    import ast

    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("parity", "__future__")}


def test_every_module_a_workflow_job_imports_is_in_the_lock(pins):
    """Each rule runs `parity ...` in the image, so every import of the package must be installable there."""
    import importlib.metadata

    owners = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(third_party_imports(ROOT / "src" / "parity")):
        dists = owners.get(module) or [GPU_MODULES.get(module, module)]
        if not any(canonical_name(d) in pins for d in dists):
            missing[module] = dists
    assert not missing, f"imported by src/parity but not in requirements.lock: {missing}"
    for dist in ("rouge-score", "nltk", "mlcommons-loadgen"):  # the MLPerf accuracy jobs run in the image too
        assert dist in pins


def test_every_extra_the_image_serves_is_in_the_lock(pyproject, pins):
    for extra in ("gpu", "workflow", "mlperf"):
        for line in pyproject["project"]["optional-dependencies"][extra]:
            name = canonical_name(Requirement(line).name)
            assert name in pins, f"the {extra} extra's {name} is not in requirements.lock"


def test_the_import_scan_sees_a_missing_module(tmp_path):
    (tmp_path / "mod.py").write_text("import json\nfrom surely_not_locked.sub import x\nimport numpy as np\n")
    assert third_party_imports(tmp_path) == {"surely_not_locked", "numpy"}


def test_make_image_is_one_line_without_apptainer():
    path = "/usr/bin:/bin"
    if shutil.which("make", path=path) is None or shutil.which("apptainer", path=path):
        pytest.skip("needs make and no apptainer on /usr/bin:/bin")
    result = subprocess.run(["make", "--no-print-directory", "image"], cwd=ROOT, env=os.environ | {"PATH": path},
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "make image: skipped: apptainer is not on PATH\n", "")
