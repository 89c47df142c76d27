"""Evidence: check trials, validate manifests and bundles, seal, sign and bundle a results tree, and write
the report."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from parity.cli import options
from parity.cli.app import echo, main
from parity.cli.errors import friendly_errors, not_an_input
from parity.errors import ParityError


@main.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--bundle", "bundles", multiple=True, type=click.Path(path_type=Path),
              help="Also check an evidence bundle (parity bundle): its bag, file by file, and its RO-Crate.")
@click.option("--public-key", "public_key", default=None, metavar="KEY",
              help="A minisign public key (a .pub file or its base64 line) every sealed tree named, or in a "
                   "bundle, must be signed by (parity sign).")
@friendly_errors
def validate_cmd(paths, bundles, public_key):
    """Validate manifests (files, or directories searched for *.json) and the files they link by hash, each
    manifest's numbers derived again from what it cites; and, with --bundle, an evidence bundle: any changed,
    missing or added file is named.

    Exits 1 and prints FILE: JSON-POINTER: RULE: MESSAGE for each problem (a bundle's: FILE: WHAT).
    """
    from parity import signature
    from parity.seal import certify

    if not paths and not bundles:
        raise click.UsageError("name manifests or folders to validate, or --bundle BUNDLE")
    missing = [p for p in (*paths, *bundles) if not p.exists()]
    if missing:
        raise click.ClickException(f"no such file or directory: {missing[0]}")
    key = signature.public_key(public_key) if public_key is not None else None  # "": refused, not skipped
    if bundles:
        from parity import bundle

        problems = [problem for folder in bundles for problem in bundle.check(folder, key)]
        for problem in problems:
            click.echo(problem, err=True)
        if problems:
            raise click.ClickException(f"{len(problems)} problem(s) in {len(bundles)} bundle(s)")
        click.echo(f"{len(bundles)} bundle(s) valid: every file as the bag lists it, the crate as its profiles ask")
        if not paths:
            return
    checked, problems = certify(paths)
    sealed = [path for path in paths if (path / "run.json").is_file()]
    problems += [line for path in sealed for line in signature.problems(path, key)] if key else []
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        raise click.ClickException(f"{len(problems)} problem(s) in {checked} manifest(s)")
    if checked == 0:
        raise click.ClickException("no manifests found")
    for path in sealed if key is None else []:
        if key_id := signature.signed_by(path):
            click.echo(f"{path}/run.json carries a signature by key {key_id}, not checked: give --public-key")
    click.echo(f"{checked} manifest(s) valid: each against its schema, every hash link intact, what each states "
               "derived again" + (f"; every kept file of the {len(sealed)} sealed tree(s) linked" if sealed else "")
               + (f"; {len(sealed)} tree(s) signed by the key given" if key else ""))


@main.command("seal")
@click.argument("results", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--input", "inputs", multiple=True, type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="A manifest of the run's inputs from outside RESULTS (a fetch receipt); repeatable.")
@friendly_errors
def seal_cmd(results, inputs):
    """Validate every manifest of RESULTS, then write RESULTS/run.json linking every kept file no other manifest
    links (logs, side files) and the tree's top manifests: after it, `parity validate RESULTS` names any file
    changed, deleted or added. Exits 1 with each problem (and no run manifest) if the tree does not validate."""
    from parity.seal import SealError, seal

    summary, problems = seal(results, inputs, log=echo)
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        raise SealError(f"not sealed: {len(problems)} problem(s) in the manifests of {results}")
    click.echo(f"sealed {results}: {summary['manifests']} manifest(s) valid; {summary['run_manifest']} links its "
               f"{summary['tops']} top manifest(s), {summary['files']} other file(s) and {summary['inputs']} input(s); "
               f"every one of the {summary['kept']} kept files is linked")


@main.command("sign")
@click.argument("results", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--key", "secret_key", required=True, type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="A minisign secret key (minisign -G); an encrypted one's password from PARITY_SIGNING_PASSWORD "
                   "or asked for.")
@friendly_errors
def sign_cmd(results, secret_key):
    """Sign RESULTS/run.json (minisign's format: RESULTS/run.json.minisig) after validating the tree, so a
    reviewer holding the public key knows who vouched for it: `parity validate RESULTS --public-key KEY.pub`,
    or `minisign -V -p KEY.pub -m RESULTS/run.json`."""
    from parity import signature
    from parity.seal import certify

    _checked, problems = certify([results])
    if problems:
        raise click.ClickException(f"not signed: {results} does not validate ({len(problems)} problem(s), "
                                   f"first: {problems[0]})")
    password = os.environ.get("PARITY_SIGNING_PASSWORD")
    if password is None and sys.stdin.isatty():
        password = click.prompt("password of the secret key (empty if none)", hide_input=True, default="",
                                show_default=False) or None
    out = signature.sign(results, secret_key, password)
    click.echo(f"signed {results}/run.json: {out}")


@main.command("bundle")
@click.argument("results", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, callback=options.out_folder,
              help="The bundle folder (a BagIt bag); an earlier bundle there is replaced.")
@click.option("--workdir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=Path("."),
              show_default=True, help="Where the Snakefile and Snakemake's job records (.snakemake/metadata) are.")
@click.option("--image", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="The Apptainer image, hashed into the crate.")
@friendly_errors
def bundle_cmd(results, out, workdir, image):
    """One evidence bundle of a run: RESULTS (all but empty logs and lock files) and the workflow, an RO-Crate
    (Workflow Run Crate) of what ran, in a BagIt bag at OUT; check it with `parity validate --bundle OUT`."""
    from parity import bundle

    summary = bundle.make(results, out, workdir=workdir, image=image, log=echo)
    click.echo(f"wrote {summary['bundle']}: {summary['files']} result files ({summary['bytes'] / 1e6:.1f} MB in all), "
               f"{summary['jobs']} job(s) in its RO-Crate")


@main.command("check")
@click.argument("trials", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--pinning-from", type=click.Path(path_type=Path, exists=True), default=None,
              help="A trial whose shard -> GPU UUID mapping the others must match (the paired standalone run).")
@friendly_errors
def check_cmd(trials, pinning_from):
    """Run the four per-request checks on trial manifests and write each one's verdict; exit 1 if any failed."""
    from parity.checks import check_file, pinning_of, read_trial

    pinning = pinning_of(read_trial(pinning_from)) if pinning_from else None
    for path in trials:  # every file a trial manifest whose timing is its records' before any verdict is written
        read_trial(path)
    failed = 0
    for path in trials:
        verdict = check_file(path, pinning)
        failed += verdict["status"] == "failed"
        click.echo(f"{path}: {verdict['status']}" + "".join(f"\n  {r}" for r in verdict["reasons"]))
    click.echo(f"{len(trials) - failed} passed, {failed} failed", err=True)
    if failed:
        raise SystemExit(1)


@main.command("report")
@click.option("--experiment", "experiments", type=click.Path(path_type=Path), multiple=True,
              help="Experiment folder or experiment.json (repeat the option).")
@click.option("--results", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Results folder: uses every RESULTS/*/experiment.json.")
@click.option("--mlperf", "mlperf_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder of `parity mlperf run/compare` manifests (optional; absent: \"not run\").")
@click.option("--reference", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The study's published numbers (default: the repository's config/study-reference.yaml).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, callback=options.out_folder,
              help="Folder for report.md, *.png and report.json.")
@friendly_errors
def report_cmd(experiments, results, mlperf_dir, reference, out_dir):
    """Tables shaped like the study's with its numbers beside ours, PNG plots, and a report manifest."""
    from parity.report import write_report
    from parity.report.inputs import find_experiments
    from parity.report.reference import DEFAULT_REFERENCE

    paths = list(experiments)
    if results is not None:
        if not results.is_dir():
            raise ParityError(f"{results}: no such results folder")
        paths += [p for p in find_experiments(results) if p.resolve() not in {Path(x).resolve() for x in paths}]
    if not paths and mlperf_dir is None:
        if results is not None:
            raise ParityError(f"{results}: no experiment in it (no {results}/*/experiment.json): give the folder a "
                              "run wrote, or --experiment DIR or --mlperf DIR")
        raise ParityError("give --experiment DIR (repeatable), --results DIR or --mlperf DIR")
    for path in paths:  # report files written into an experiment folder would sit in the evidence
        option = "--experiment" if path in experiments else f"(an experiment --results {results} holds)"
        not_an_input(out_dir, {option: path.parent if path.is_file() else path}, folder=True)
    not_an_input(out_dir, {"--mlperf": mlperf_dir, "--reference": reference}, folder=True)
    from parity.rederive import problems  # each trial, pair and experiment derived again, as validate does

    try:
        made = write_report(paths, mlperf_dir, reference or DEFAULT_REFERENCE, out_dir, derive=problems)
    except ModuleNotFoundError as exc:  # matplotlib or markdown, imported as the page is drawn: nothing is left
        raise ParityError(f"parity report needs the Python package {exc.name}, which is not installed here (it is "
                          "one of parity's own dependencies: pip install -e .)") from None
    click.echo(f"evidence: {made['evidence'] or 'none'}")
    if "confirmation" not in made["manifest"]["missing_experiments"]:  # else a table of dashes
        click.echo(made["final_table"], nl=False)
    outputs = made["manifest"]["outputs"]
    click.echo(f"wrote {out_dir / outputs['markdown']['path']}, {outputs['html']['path']}, report.json and "
               f"{len(outputs['plots'])} plot(s) there", err=True)
