"""Every `trl-variants train|evaluate|presample` command in the fenced bash blocks of the README and the docs parses
with the parser that will read it (a flag renamed in the code and not in the docs fails here), without running it.

Training commands (`trl-variants train M ...`, `accelerate launch ... -m trl_variants train M ...`,
`accelerate launch ... examples/train_M.py ...`) go through `trl_variants.training.parse_args`, evaluate
commands through `trl_variants.cli.evaluate_command.parse_evaluate_args` and its correctness check, presample
commands through its parser.
GPU-only values are parsed as on a CPU (`--use_cpu true`: transformers refuses bf16 without a GPU at parse time).
Lines with `...` (an elided command) or a `<placeholder>` where a path is parsed are skipped."""

import re
import shlex
from pathlib import Path

import pytest

from .helpers import HAS_CONTINUOUS_BATCHING, needs_continuous_batching

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```bash\n(.*?)^ *```", re.M | re.S)  # also inside list items (indented)


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for every trl-variants command in a fenced bash block: continuation lines joined,
    comments dropped."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for block in FENCE.findall(text):
            lines, current = [], ""
            for raw in block.splitlines():
                line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()  # a comment, never inside a quoted value here
                if line.endswith("\\"):
                    current += line[:-1] + " "
                    continue
                lines.append(current + line)
                current = ""
            for line in lines:
                line = line.strip()
                if "..." in line or not re.search(r"trl-variants (train|evaluate|presample) |-m trl_variants train "
                                                  r"|examples/train_\w+\.py", line):
                    continue
                found.append((f"{path.relative_to(ROOT)}: {line[:60]}", line))
    return found


COMMANDS = doc_commands()


def _split(command: str) -> list[str]:
    # `$(trl-variants recipes --path accelerate/zero2)` and `$(which trl-variants)` are shell substitutions
    command = re.sub(r"\$\(which trl-variants\)", "trl-variants", command)
    command = re.sub(r"\$\([^)]*\)", "SUBSTITUTED", command)
    argv = shlex.split(command)
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value prefixes
        argv = argv[1:]
    return argv


def _train_argv(argv: list[str]) -> tuple[str, list[str]] | None:
    for i, arg in enumerate(argv):
        if arg == "train" and i > 0 and argv[i - 1] in ("trl-variants", "trl_variants"):
            return argv[i + 1], argv[i + 2:]
        m = re.fullmatch(r"examples/train_(\w+)\.py", arg)
        if m:
            return m.group(1), argv[i + 1:]
    return None


def test_the_docs_have_commands():
    kinds = " ".join(c for _, c in COMMANDS)
    assert "trl-variants evaluate" in kinds and "trl-variants train" in kinds and "accelerate launch" in kinds


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_doc_command_parses(where, command, tmp_path, monkeypatch):
    if "--use_transformers_continuous_batching" in command and not HAS_CONTINUOUS_BATCHING:
        pytest.skip(needs_continuous_batching.kwargs["reason"])
    monkeypatch.chdir(ROOT)  # the docs' clone paths (configs/..., examples/...) are relative to the repository
    argv = _split(command)
    train = _train_argv(argv)
    if train is not None:
        from trl_variants.recipe_catalog import default_recipe
        from trl_variants.registry import method_classes
        from trl_variants.training import parse_args
        from trl_variants.training.run import _with_resolved_config

        method, flags = train
        if method in ("--list", "-l", "--help"):
            return
        if "--ddp_backend" in flags:  # a process group's backend: this one process has none to set up
            j = flags.index("--ddp_backend")
            assert flags[j + 1] in ("nccl", "gloo", "mpi", "ccl", "hccl", "cncl", "mccl", "xccl"), where
            flags = flags[:j] + flags[j + 2:]
        if "--use_cpu" in flags:
            flags[flags.index("--use_cpu") + 1] = "true"
        else:
            flags += ["--use_cpu", "true"]
        flags += ["--output_dir", str(tmp_path / "out")]
        _, config_cls = method_classes(method)
        parse_args(config_cls, default_recipe(method), argv=_with_resolved_config(flags, method))
        return
    i = argv.index("trl-variants")
    command_name, flags = argv[i + 1], argv[i + 2:]
    if command_name == "evaluate":
        from trl_variants.cli.evaluate_command import check_correctness_flags, parse_evaluate_args

        script_args, _ = parse_evaluate_args(flags)
        check_correctness_flags(script_args)
    elif command_name == "presample":
        from trl_variants.cli import COMMAND_HELP
        from trl_variants.cli.parser import Parser
        from trl_variants.cli.presample_command import PresampleScriptArguments
        from trl_variants.presample import PresampleConfig

        if "--config" in flags:  # a YAML of the user's own (my_presample.yaml): only the flags are checked
            j = flags.index("--config")
            flags = flags[:j] + flags[j + 2:]
        Parser((PresampleScriptArguments, PresampleConfig), prog="trl-variants presample",
               description=COMMAND_HELP["presample"]).parse_args_and_config(args=flags)
    else:
        pytest.fail(f"{where}: not a command this test knows: {command}")
