"""Every `tritonship` subcommand meets bad paths and endpoints with one sentence: a missing or unreadable
file, a directory where a file belongs, JSON that is not what the step wrote, an endpoint that does not
answer, a repository the gate does not mount. Each exits 2, prints one line and no traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from components.release.publish import publish
from components.release.run_context import RunContext
from pipelines.cli import app
from pipelines.processes import free_port
from tests.models import MLP_SIGNATURE, mlp_folder, write_signature
from tests.release_helpers import unique


@pytest.fixture(scope="module")
def files(tmp_path_factory, stack) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "a_dir").mkdir()
    (root / "not_a_verdict.json").write_text(json.dumps({"hello": "world"}))
    (root / "not_json.json").write_text("this is { not json")
    (root / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    signature = write_signature(root / "sig.yaml", MLP_SIGNATURE)
    for label, dims, shape in BAD_RANGES:
        ranged = {**MLP_SIGNATURE, "dims": dims, "inputs": [{"name": "x", "dtype": "fp32", "shape": shape}]}
        write_signature(root / f"{label}.yaml", ranged)
    # a candidate published under a root the gate server does not mount
    (root / "m").mkdir()
    name = unique("nomount")
    publish(RunContext(f"s3://{stack.bucket}/elsewhere", "", s3=stack.s3), folder=mlp_folder(root / "m", name))
    return {
        "dir": str(root / "a_dir"),
        "missing": str(root / "missing.json"),
        "not_verdict": str(root / "not_a_verdict.json"),
        "not_json": str(root / "not_json.json"),
        "binary": str(root / "binary.json"),
        "signature": str(signature),
        **{label: str(root / f"{label}.yaml") for label, _dims, _shape in BAD_RANGES},
        "out": str(root / "out"),
        "closed": f"127.0.0.1:{free_port()}",
        "unmounted_model": name,
        "repo": f"s3://{stack.bucket}",
        "elsewhere": f"s3://{stack.bucket}/elsewhere",
        "no_bucket": "s3://no-such-bucket-here",
    }


# signatures whose dynamic dimension's range is wrong: (label, dims, the input's shape)
BAD_RANGES = [
    ("min_above_max", {"n": {"min": 9, "opt": 9, "max": 4}}, [-1, "n"]),
    ("opt_outside", {"n": {"min": 2, "opt": 50, "max": 16}}, [-1, "n"]),
    ("fixed_range", {"n": {"min": 16, "opt": 16, "max": 16}}, [-1, "n"]),
    ("undeclared", {}, [-1, "n"]),
    ("range_on_batch", {"n": {"min": 1, "opt": 8, "max": 16}}, ["n", 16]),
]
GATE_ARGS = ["-r", "{repo}", "-m", "m", "--version", "1", "--gate", "{gate}", "--out", "{out}"]
# (subcommand words, arguments, what the sentence must say); {name} is filled from `files`
CASES = [
    (
        ["export"],
        ["--model", "tests.models:make_mlp", "--signature", "{missing}", "--out", "{out}"],
        "missing.json does not exist",
    ),
    (["export"], ["--model", "tests.models:make_mlp", "--signature", "{dir}", "--out", "{out}"], "a_dir is a folder"),
    *(
        (["export"], ["--model", "tests.models:make_mlp", "--signature", "{" + label + "}", "--out", "{out}"], said)
        for label, said in (
            ("min_above_max", "dimension 'n' has min 9 above max 4; swap them"),
            ("opt_outside", "dimension 'n' has opt 50 outside its range 2 to 16"),
            ("fixed_range", "dimension 'n' has min = max = 16, so it is fixed; write 16 in the shapes"),
            ("undeclared", "shape names the dimension 'n', which dims does not declare"),
            ("range_on_batch", "dimension 0 is the batch"),
        )
    ),
    (["compile"], ["{missing}", "--name", "m", "--out", "{out}"], "missing.json does not exist"),
    (["compile"], ["{dir}", "--name", "m", "--out", "{out}"], "export.json"),
    (["publish"], ["{missing}", "-r", "{repo}"], "missing.json"),
    (
        ["ensemble"],
        [
            "{dir}",
            "--name",
            "e",
            "--signature",
            "{missing}",
            "--model",
            "tests.models:make_mlp",
            "--pre",
            "{dir}",
            "--pre-signature",
            "{signature}",
            "--post",
            "{dir}",
            "--post-signature",
            "{signature}",
            "--inputs",
            "{missing}",
            "--out",
            "{out}",
        ],
        "missing.json",
    ),
    (["stage"], ["-r", "{repo}", "-m", "m", "--version", "1", "--gate", "{closed}"], "not published"),
    (
        ["stage"],
        ["-r", "{elsewhere}", "-m", "{unmounted_model}", "--version", "1", "--gate", "{gate}"],
        "does not see {unmounted_model}__candidate",
    ),
    (["tune"], ["-r", "{repo}", "-m", "m", "--version", "1", "--gate", "{closed}", "--out", "{out}"], "m"),
    (["calibrate", "gate"], ["-r", "{repo}", "-m", "m", "--gate", "{gate}"], "'m' has no promoted version"),
    (
        ["calibrate", "quality"],
        ["-r", "{repo}", "-m", "m", "--gate", "{gate}", "--versions", "1,2", "--eval-data", "{missing}"],
        "without --quality-spec",
    ),
    (
        ["gate"],
        [
            *GATE_ARGS,
            "--stage-result",
            "{missing}",
        ],
        "does not exist",
    ),
    (
        ["gate"],
        [
            *GATE_ARGS,
            "--stage-result",
            "{not_verdict}",
        ],
        "not a stage result",
    ),
    (
        ["gate"],
        [*GATE_ARGS, "--tuning", "{not_json}"],
        "not a tuning result",
    ),
    (
        ["gate"],
        [*GATE_ARGS, "--min-rounds", "2"],
        "--min-rounds must be at least 5",
    ),
    (
        ["quality"],
        [*GATE_ARGS, "--eval-data", "{missing}", "--quality-spec", "{not_verdict}"],
        "metrics: Field required",
    ),
    (["quality"], [*GATE_ARGS, "--eval-data", "{missing}"], "--eval-data is given without --quality-spec"),
    (["promote"], ["-r", "{repo}", "--verdict", "{missing}", "--replicas", "{closed}"], "does not exist"),
    (["promote"], ["-r", "{repo}", "--verdict", "{dir}", "--replicas", "{closed}"], "is a directory"),
    (["promote"], ["-r", "{repo}", "--verdict", "{not_verdict}", "--replicas", "{closed}"], "not a verdict"),
    (["promote"], ["-r", "{repo}", "--verdict", "{binary}", "--replicas", "{closed}"], "is not a text file"),
    (["reject"], ["-r", "{repo}", "--verdict", "{not_json}"], "not a verdict"),
    (["reconcile"], ["-r", "{repo}", "--replicas", "{closed}"], "no replica answered"),
    (["repo", "ls"], ["-r", "{no_bucket}"], "no-such-bucket-here"),
    (["repo", "verify"], ["-r", "{no_bucket}"], "no-such-bucket-here"),
    (["repo", "gc"], ["-r", "{no_bucket}"], "no-such-bucket-here"),
    (["repo", "history"], ["m", "-r", "{no_bucket}"], "no-such-bucket-here"),
    (["lease", "show"], ["-m", "m", "-r", "{no_bucket}"], "no-such-bucket-here"),
    (["lease", "release"], ["-m", "m", "-r", "{no_bucket}"], "no-such-bucket-here"),
    (["stack", "env"], ["--state-dir", "{dir}"], "no stack is up"),
    (["stack", "down"], ["--state-dir", "{dir}"], "no stack is up"),
    (["stack", "up"], ["--state-dir", "{binary}"], "binary.json"),
    (["pipeline", "compile"], ["--out", "{dir}"], "must name a .yaml file"),
    (["run"], ["--local", "--no-stack", "-p", "nope=1"], "no parameter 'nope'"),
    (["submit"], ["--host", "http://{closed}", "-p", "nope=1"], "no parameter 'nope'"),
    (["schedule"], ["--host", "http://{closed}", "--cron", "0 3 * * *"], "KFP takes 6"),
    (["demo"], ["--workdir", "{binary}"], "binary.json"),
    (["images", "build"], ["--local", "--json", "{dir}"], "must name a file in an existing folder"),
]


def _all_subcommands() -> set[tuple[str, ...]]:
    import typer.main

    click_app = typer.main.get_command(app)
    found = set()
    for name, command in click_app.commands.items():
        if hasattr(command, "commands"):
            found |= {(name, sub) for sub in command.commands}
        else:
            found.add((name,))
    return found


def test_the_walk_covers_every_subcommand():
    assert {tuple(words) for words, _args, _expected in CASES} == _all_subcommands()


@pytest.mark.parametrize(
    ("words", "args", "expected"), CASES, ids=[" ".join(c[0]) + f"-{i}" for i, c in enumerate(CASES)]
)
def test_bad_arguments_get_one_sentence_and_exit_2(words, args, expected, files, stack, tmp_path):
    """In-process through typer's runner (the console script calls the same `app`): an exception that
    escaped the command would come back as `result.exception` instead of a clean exit."""
    values = {**files, "gate": stack.gate.http_url, "out": str(tmp_path / "out")}
    argv = [a.format(**values) for a in args]
    result = CliRunner().invoke(app, [*words, *argv], env={**stack.s3.env(), "COLUMNS": "200"})
    output = result.output.strip()
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, (output, result.exception)
    assert "Traceback" not in output
    assert len(output.splitlines()) == 1, output
    assert expected.format(**values) in output, output


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_serving_torch_that_is_no_version_is_one_sentence(how, tmp_path):
    """Checked before anything is read or sent: no stack needed."""
    given = ["--serving-torch", "nonsense"] if how == "option" else []
    env = {"TRITONSHIP_SERVING_TORCH": "nonsense", "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["publish", str(tmp_path), "-r", "s3://no-such-bucket-here", *given], env=env)
    output = result.output.strip()
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, (output, result.exception)
    assert "Traceback" not in output and len(output.splitlines()) == 1, output
    assert "--serving-torch must be a torch version such as 2.14.0, not 'nonsense'" in output, output


def test_no_flag_in_any_commands_help_is_tagged_with_a_type():
    """A flag takes no value: `--containers`, not `--containers <bool>` (Typer tags every option)."""
    import click
    import typer

    def commands(group: click.Group, words: list[str]) -> list[list[str]]:
        found = []
        for name, command in group.commands.items():
            found += commands(command, [*words, name]) if isinstance(command, click.Group) else [[*words, name]]
        return found

    every = commands(typer.main.get_command(app), [])
    assert len(every) >= 20
    for words in every:
        shown = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "--help" in shown.output, words
        assert "<bool>" not in shown.output, words


def test_the_demo_takes_pipeline_parameters_but_not_those_its_story_sets():
    """`tritonship demo -p` hands every release a pipeline parameter (model_image, compile_target, …); the ones
    the story sets for each release are one sentence, before any stack starts."""
    refused = CliRunner().invoke(app, ["demo", "-p", "model_source=mypkg:build", "-p", "gate=h:1", "-p", "tune=false"])
    assert refused.exit_code == 2, refused.output
    assert "error: the demo's story sets gate, model_source itself; give the other parameters only." in refused.output
    unknown = CliRunner().invoke(app, ["demo", "-p", "no_such=1"])
    assert unknown.exit_code == 2 and "the pipeline has no parameter 'no_such'" in unknown.output
