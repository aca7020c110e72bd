"""From a paper recipe to a run that starts: the training entry point's checks before anything loads.

* the preflight (``trl_variants.training.check_prerequisites``) lists, in one message, every extra, login and Hub
  setting a run needs and this machine lacks, and refuses an untouched paper recipe (its ``hub_model_id`` is a
  placeholder) before any data or model loads;
* every paper recipe's header has a ``# smoke:`` command (a small model, two steps, one GPU, nothing pushed or
  tracked) and an ``# extras:`` line; the smoke commands parse and pass the preflight, and they train on CPU with the
  tiny model and the embedded task substituted;
* a recipe's batch follows the hardware: on another process count than its ``# processes:`` header the global
  batch is kept (``recipe_batch``) or the run is refused with the arithmetic; a real two-process run rescales a
  one-process recipe;
* ``--resume_from_checkpoint true`` from the command line resumes the last checkpoint of output_dir, and fails,
  naming output_dir, before the model loads when there is none.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainers_tests.examples.test_configs import (  # noqa: F401 (bf16_anywhere is a fixture)
    CONFIG_CLASSES,
    PAPER_RECIPES,
    ROOT,
    _rel,
    batch_arithmetic,
    bf16_anywhere,
    header_comment,
    parse_recipe,
    read_header,
)

# the CPU stand-ins for a smoke command's GPU settings: the tiny model, the embedded task, short completions
CPU_FLAGS = ["--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--gradient_checkpointing", "false",
             "--dataset_name", "embedded", "--embedded_test_size", "8", "--max_completion_length", "8",
             "--max_steps", "1", "--logging_steps", "1", "--save_strategy", "no", "--torch_threads", "2"]
CPU_EXTRA = {"dph": ["--drop_unsolved", "false", "--dynamic_sampling_max_rounds", "1"]}
# the recipe keys that describe its Hub dataset; the embedded task replaces them in the CPU run
DATA_KEYS = ("dataset_name", "dataset_config", "prompt_column", "prompt_suffix", "prompt_format", "prompt_regex",
             "system_prompt", "filter_column", "filter_values", "filter_prompt_length", "solution_column")


class Loaded(Exception):
    pass


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail loudly if a model or a dataset starts loading."""
    import transformers

    import trl_variants.training.run

    def fail(*args, **kwargs):
        raise Loaded("a model or the data started loading")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(fail))
    monkeypatch.setattr(trl_variants.training.run, "load_datasets", fail)


@pytest.fixture
def bare_machine(monkeypatch, tmp_path):
    """No wandb key, no netrc, no Hub token: what a fresh machine has."""
    import huggingface_hub

    for name in ("WANDB_API_KEY", "WANDB_MODE", "HF_TOKEN", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)


def smoke_command(path: Path) -> list[str]:
    """The ``# smoke:`` command of a recipe's header (continued over lines ending in a backslash), as argv."""
    comment = header_comment(path).replace("\\\n", " ")
    lines = [line for line in comment.splitlines() if line.startswith("smoke:")]
    assert len(lines) == 1, f"{_rel(path)}: the header needs exactly one `# smoke:` command"
    return shlex.split(lines[0].removeprefix("smoke:"))


def smoke_argv(path: Path) -> list[str]:
    """The smoke command's options (after ``trl-variants train METHOD``), checked to name this recipe."""
    argv = smoke_command(path)
    method = path.parent.name
    assert argv[:3] == ["trl-variants", "train", method], f"{_rel(path)}: {argv[:3]}"
    assert argv[3:5] == ["--config", f"{method}/{path.stem}"], f"{_rel(path)}: the smoke command must name it"
    return argv[3:]


def flag(argv: list[str], name: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=_rel)
@pytest.mark.usefixtures("bf16_anywhere", "bare_machine")
def test_smoke_command_is_small_and_passes_the_preflight(path):
    import trl_variants
    from trl_variants._config_checks import launch_processes as num_processes
    from trl_variants.recipe_catalog import resolve_recipe
    from trl_variants.training import parse_args, prerequisite_problems, recipe_batch

    argv = smoke_argv(path)
    for name, value in [("--max_steps", "2"), ("--push_to_hub", "false"), ("--report_to", "none"),
                        ("--use_vllm", "false")]:
        assert flag(argv, name) == value, f"{_rel(path)}: the smoke command needs {name} {value}"
    assert "0.5B" in flag(argv, "--model_name_or_path")
    assert flag(argv, "--output_dir") != yaml.safe_load(path.read_text())["output_dir"]
    config = resolve_recipe(flag(argv, "--config"))
    assert config.resolve() == path.resolve()
    # one GPU: its own batch flags, so the 8-process recipe is not rescaled to the paper's batch on one device
    flags, note = recipe_batch(config, argv, 1)
    assert flags == [] and "your batch flags" in note and num_processes() == 1
    argv = [a if a != flag(argv, "--config") else str(config) for a in argv]
    _, args, _ = parse_args(getattr(trl_variants, CONFIG_CLASSES[path.parent.name]), argv=argv)
    assert prerequisite_problems(args) == [], _rel(path)
    # one rollout batch of whole groups, one optimizer step each: small
    assert args.per_device_train_batch_size * args.steps_per_generation == args.generation_batch_size
    assert args.generation_batch_size // args.num_generations <= 8


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=_rel)
def test_extras_line_names_what_the_recipe_uses(path):
    comment = header_comment(path)
    match = re.search(r"^extras: (.*)$", comment, re.M)
    assert match, f"{_rel(path)}: the header needs an `# extras: ...` line"
    raw = yaml.safe_load(path.read_text())
    report_to = raw.get("report_to") or []
    used = ({"vllm"} if raw.get("use_vllm") else set()) | {t for t in report_to if t != "none"}
    if re.search(r"--config_file \S*(zero\d|deepspeed)\S*\.yaml", comment):
        used.add("deepspeed")
    assert set(match.group(1).split()) == used, _rel(path)
    assert f'pip install "trl-variants[{",".join(match.group(1).split())}]"' in comment


@pytest.mark.usefixtures("bf16_anywhere", "bare_machine", "nothing_loads")
def test_untouched_recipe_is_refused_before_anything_loads_naming_the_hub_id(capsys):
    """The recipe as shipped: transformers would create ``your-org/...`` after the 7B model has loaded."""
    from trl_variants.cli import main

    with pytest.raises(ValueError) as err:
        main(["train", "erpo", "--config", "erpo/qwen2.5-math-7b"])
    message = str(err.value)
    assert "cannot start here" in message
    assert "'your-org/Qwen2.5-Math-7B-ERPO'" in message
    assert "--hub_model_id <you>/Qwen2.5-Math-7B-ERPO" in message and "--push_to_hub false" in message
    assert "hf auth login" in message  # and no token
    assert "wandb login" in message  # the tracker's login
    # one message, one line per problem
    assert message.count("\n  - ") == len(re.findall(r"^  - ", message, re.M)) >= 3
    # on one process the paper's batch was kept, with the arithmetic
    assert "gradient_accumulation_steps 32 -> 256 and steps_per_generation 128 -> 1024 keep its batch" in \
        capsys.readouterr().out


def test_preflight_lists_every_missing_extra_and_login(monkeypatch, tmp_path, bare_machine):
    import importlib.util
    from types import SimpleNamespace

    from trl_variants.training import prerequisite_problems

    find_spec = importlib.util.find_spec
    missing = {"vllm", "deepspeed", "wandb"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else find_spec(name, *a))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` with zero2.yaml sets
    args = SimpleNamespace(use_vllm=True, report_to=["wandb", "trackio"], push_to_hub=True,
                           hub_model_id="your-org/Model", resume_from_checkpoint="true",
                           output_dir=str(tmp_path / "empty"))
    problems = prerequisite_problems(args)
    text = "\n".join(problems)
    assert len(problems) == 8, text  # vllm, deepspeed, wandb, wandb login, hub id, token, offline, resume
    for expected in ['"trl-variants[vllm]"', '"trl-variants[deepspeed]"', '"trl-variants[wandb]"', "wandb login",
                     "--hub_model_id <you>/Model", "hf auth login", "HF_HUB_OFFLINE", str(tmp_path / "empty")]:
        assert expected in text
    assert "report_to: [trackio]" not in text  # installed here ([dev])
    # logged in three ways: the key, the netrc entry `wandb login` writes, or an offline run
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert not any("wandb login" in p for p in prerequisite_problems(args))
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert not any("wandb login" in p for p in prerequisite_problems(args))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert not any("wandb login" in p for p in prerequisite_problems(args))
    # nothing asked, nothing missing; DeepSpeed only when the launch asks for it
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    plain = SimpleNamespace(use_vllm=False, report_to=[], push_to_hub=False, hub_model_id=None,
                            resume_from_checkpoint=None, output_dir=str(tmp_path))
    assert prerequisite_problems(plain) == []


# --- the batch on another process count ---------------------------------------------------------------------------

def with_header(path: Path, raw: dict) -> str:
    """``raw`` as YAML under the comment block that opens ``path`` (its ``# processes:`` header among it)."""
    lines = path.read_text().splitlines()
    header = lines[:next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))]
    return "\n".join(header) + "\n" + yaml.safe_dump(raw)


def _apply(path: Path, flags: list[str], tmp_path: Path) -> Path:
    """A copy of the recipe with ``flags`` (``--field value`` pairs) written into it (batch_arithmetic reads the
    YAML's batch fields)."""
    raw = yaml.safe_load(path.read_text())
    for name, value in zip(flags[::2], flags[1::2], strict=True):
        raw[name.removeprefix("--")] = int(value)
    folder = tmp_path / path.parent.name
    folder.mkdir(exist_ok=True)
    (folder / path.name).write_text(with_header(path, raw))
    return folder / path.name


@pytest.mark.parametrize("processes", [1, 2, 4])
@pytest.mark.parametrize("path", PAPER_RECIPES, ids=_rel)
@pytest.mark.usefixtures("bf16_anywhere")
def test_a_recipe_keeps_its_global_batch_on_1_2_and_4_processes(path, processes, tmp_path):
    import trl_variants
    from trl_variants.training import recipe_batch

    header = read_header(path)
    flags, note = recipe_batch(path, [], processes, getattr(trl_variants, CONFIG_CLASSES[path.parent.name]))
    assert flags and f"is written for 8 processes, this run has {processes}" in note
    assert f"{header['completions_per_step']} completions per optimizer step" in note
    rescaled = _apply(path, flags, tmp_path)
    _, args, _ = parse_recipe(rescaled)
    numbers = batch_arithmetic(rescaled, args, processes, header.get("train_prompts"))
    assert {k: header[k] for k in numbers} == numbers
    assert args.per_device_train_batch_size == yaml.safe_load(path.read_text())["per_device_train_batch_size"]


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=_rel)
def test_a_process_count_that_cannot_keep_the_batch_is_refused_with_the_arithmetic(path):
    from trl_variants.training import recipe_batch

    for processes in (3, 7):  # 7: one node of 8 GPUs, one of them serving vLLM
        with pytest.raises(ValueError) as err:
            recipe_batch(path, [], processes)
        message = str(err.value)
        assert f"is written for 8 processes, this run has {processes}, and no whole numbers keep its batch" in message
        assert f"x 8/{processes} = " in message and "1, 2, 4, 8, 16" in message
        assert "--keep_recipe_batch false" in message and "Nothing was loaded" in message


def test_own_batch_flags_or_keep_recipe_batch_false_turn_the_rescale_off(tmp_path):
    from trl_variants.recipe_catalog import RECIPES_DIR
    from trl_variants.training import recipe_batch

    erpo = RECIPES_DIR / "erpo" / "qwen2.5-math-7b.yaml"
    assert recipe_batch(erpo, [], 8) == ([], "")  # the recipe's own count
    flags, note = recipe_batch(erpo, ["--gradient-accumulation-steps=3"], 3)
    assert flags == [] and "your batch flags (--gradient_accumulation_steps) decide the batch" in note
    for opt_out in (["--keep_recipe_batch", "false"], ["--keep_recipe_batch=false"], ["--no_keep_recipe_batch"]):
        flags, note = recipe_batch(erpo, opt_out, 4)
        assert flags == [] and "512 completions per optimizer step (the recipe's 1024)" in note
    assert recipe_batch(erpo, ["--keep_recipe_batch", "true"], 4)[0]
    # no header: nothing to keep
    own = tmp_path / "own.yaml"
    own.write_text("# my own YAML\nper_device_train_batch_size: 8\n")
    assert recipe_batch(own, [], 2) == ([], "")


def test_the_slurm_launchers_flags_are_not_rescaled_again():
    """slurm_train.sh rescales on the command line; the trainer then sees batch flags and leaves them alone."""
    from trl_variants.recipe_catalog import RECIPES_DIR
    from trl_variants.training import recipe_batch

    erpo = RECIPES_DIR / "erpo" / "qwen2.5-math-7b.yaml"
    slurm = ["--gradient_accumulation_steps", "16", "--steps_per_generation", "64"]  # test_multinode's 16 processes
    assert recipe_batch(erpo, [], 16)[0] == slurm
    assert recipe_batch(erpo, slurm, 16)[0] == []


ONE_PROCESS_RECIPE = """\
# ERPO on the embedded task, written for one process (a test of the rescale on two).
# processes: 1
output_dir: {out}
use_cpu: true
bf16: false
gradient_checkpointing: false
dataset_name: embedded
embedded_train_size: 64
embedded_test_size: 8
num_generations: 4
per_device_train_batch_size: 8
gradient_accumulation_steps: 2
max_completion_length: 8
max_steps: 1
save_strategy: steps
save_steps: 1
report_to: none
torch_threads: 1
"""


@pytest.mark.slow
def test_two_processes_rescale_a_one_process_recipe(tmp_path):
    recipe = tmp_path / "one.yaml"
    recipe.write_text(ONE_PROCESS_RECIPE.format(out=tmp_path / "out"))
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore",
               TRL_VARIANTS_CACHE=str(tmp_path / "cache"))
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", "29565", "-m", "trl_variants",
                           "train", "erpo", "--config", str(recipe)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = (f"{recipe} is written for 1 process, this run has 2: gradient_accumulation_steps 2 -> 1 keeps its batch "
            "(8/device x 2 processes x 1 = 16 completions per optimizer step, x 1 = 16 per rollout batch)")
    assert proc.stdout.count(line) == 1, proc.stdout[-2000:]  # printed once, by rank 0
    assert "trained on 2 process(es)" in proc.stdout
    state = json.loads((tmp_path / "out" / "checkpoint-1" / "trainer_state.json").read_text())
    config = state["stateful_callbacks"]["TrlVariantsCheckpoint"]["config"]
    assert (config["world_size"], config["per_device_train_batch_size"], config["gradient_accumulation_steps"],
            config["steps_per_generation"]) == (2, 8, 1, 1)  # 8 x 2 x 1 = the recipe's 8 x 1 x 2


# --- the smoke commands, run on CPU ------------------------------------------------------------------------------

def cpu_smoke_argv(path: Path, tmp_path: Path) -> list[str]:
    """A recipe's smoke command with the tiny model and the embedded task substituted: the recipe copied (header
    kept) without its dataset keys, the CPU flags added, 8 prompts, and a fresh output_dir."""
    from trl_variants.default import DEFAULT_MODEL_PATH

    argv = smoke_argv(path)
    raw = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k not in DATA_KEYS}
    copy = tmp_path / path.name
    copy.write_text(with_header(path, raw))
    argv[argv.index("--config") + 1] = str(copy)
    argv[argv.index("--model_name_or_path") + 1] = DEFAULT_MODEL_PATH
    argv[argv.index("--output_dir") + 1] = str(tmp_path / "out")
    argv[argv.index("--dataset_train_split") + 1] = "train[:8]"  # 8 prompts for the offline passes (64 on a GPU)
    return [*argv, *CPU_FLAGS, *CPU_EXTRA.get(path.parent.name, [])]


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in PAPER_RECIPES if p.stem in ("qwen2.5-math-7b", "qwen2.5-3b",
                                                                         "qwen2.5-1.5B")], ids=_rel)
def test_smoke_command_trains_on_cpu_with_the_tiny_model(path, tmp_path, monkeypatch, capsys):
    from trl_variants.cli import main

    monkeypatch.setenv("TRL_VARIANTS_CACHE", str(tmp_path / "cache"))
    argv = cpu_smoke_argv(path, tmp_path)
    main(["train", path.parent.name, *argv])
    out = capsys.readouterr().out
    assert "trained on 1 process(es)" in out and "keep its batch" not in out
    assert (tmp_path / "out" / "model.safetensors").exists()


# --- resume from the command line -----------------------------------------------------------------------------------

RESUME_FLAGS = ["--embedded_train_size", "32", "--embedded_test_size", "8", "--per_device_train_batch_size", "8",
                "--num_generations", "4", "--max_completion_length", "8", "--heldout_eval_steps", "0",
                "--logging_steps", "1", "--save_steps", "1", "--save_total_limit", "3", "--torch_threads", "2"]


@pytest.mark.slow
def test_resume_true_from_the_command_line_continues_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    import transformers

    from trl_variants.cli import main

    out = str(tmp_path / "out")
    main(["train", "erpo", *RESUME_FLAGS, "--output_dir", out, "--max_steps", "2"])
    assert sorted(os.listdir(out)).count("checkpoint-2") == 1
    resumed_from = []
    train = transformers.Trainer.train

    def spy(self, resume_from_checkpoint=None, *args, **kwargs):
        resumed_from.append(resume_from_checkpoint)
        return train(self, resume_from_checkpoint, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "train", spy)
    main(["train", "erpo", *RESUME_FLAGS, "--output_dir", out, "--max_steps", "3", "--resume_from_checkpoint", "true"])
    assert resumed_from == [os.path.join(out, "checkpoint-2")]
    checkpoint = os.path.join(out, "checkpoint-2")
    said = f"ERPOTrainer: resuming from {checkpoint} (after step 2; training continues to step 3)"
    assert said in capsys.readouterr().out
    state = json.loads((Path(out) / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]


@pytest.mark.parametrize("value", ["true", "last", "True"])
def test_resume_true_without_a_checkpoint_fails_before_the_model_loads(value, tmp_path, nothing_loads):
    from trl_variants.cli import main

    out = tmp_path / "empty"
    out.mkdir()
    with pytest.raises(ValueError) as err:
        main(["train", "erpo", *RESUME_FLAGS, "--output_dir", str(out), "--resume_from_checkpoint", value])
    message = str(err.value)
    assert f"{out} holds no checkpoint-N folder" in message and "--output_dir" in message
    assert "drop --resume_from_checkpoint to start a new run" in message


def test_resume_false_or_empty_starts_a_new_run():
    from trl_variants._checkpoint import resume_target

    assert [resume_target(v) for v in (None, False, "", "false", "False", " ")] == [None] * 6
    assert [resume_target(v) for v in (True, "true", "last", "LAST")] == [True] * 4
    assert resume_target("out/checkpoint-5") == "out/checkpoint-5"


def test_resume_true_is_checked_at_construction_before_the_model_loads(tmp_path, nothing_loads):
    """The Python API too: ``args.resume_from_checkpoint=True`` checks the last checkpoint's record in ``__init__``."""
    from transformers import TrainerState

    from trl_variants import EEPOConfig, ERPOConfig, ERPOTrainer, accuracy_reward
    from trl_variants._checkpoint import RECORD_FORMAT, TrlVariantsCheckpoint, resume_fields

    from ..helpers import DEFAULT_MODEL_PATH, small_config, train_dataset

    other = small_config(EEPOConfig, tmp_path)
    (tmp_path / "checkpoint-4").mkdir()
    record = {"format": RECORD_FORMAT, "trainer": "EEPOTrainer", "config": resume_fields(other), "algorithm_state": {}}
    TrainerState(stateful_callbacks={TrlVariantsCheckpoint.__name__: record}).save_to_json(
        str(tmp_path / "checkpoint-4" / "trainer_state.json"))
    for value in (True, "true", "last"):
        args = small_config(ERPOConfig, tmp_path, resume_from_checkpoint=value)
        with pytest.raises(ValueError, match=r"checkpoint-4 was written by EEPOTrainer"):
            ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                        train_dataset=train_dataset(8))


@pytest.mark.parametrize("method", ["erpo", "eepo", "dph", "apo", "composed", "grpo"])
def test_the_tiny_recipes_keep_their_global_batch_on_several_processes(method):
    """`accelerate launch` of a tiny recipe on N GPUs (or gloo CPU processes): the per-device batch is divided so the
    global batch stays what the recipe documents; a count that cannot keep it is refused with the arithmetic."""
    from trl_variants.recipe_catalog import default_recipe
    from trl_variants.registry import method_classes
    from trl_variants.training import recipe_batch

    config_cls = method_classes(method)[1]
    path = default_recipe(method)
    written = yaml.safe_load(path.read_text())["per_device_train_batch_size"]
    assert recipe_batch(path, [], 1, config_cls) == ([], "")
    for processes in (2, 4):
        flags, note = recipe_batch(path, [], processes, config_cls)
        i = flags.index("--per_device_train_batch_size")
        assert int(flags[i + 1]) * processes == written, (processes, flags)
        assert f"is written for 1 process, this run has {processes}" in note and "keep" in note
    with pytest.raises(ValueError, match="this run has 3, and no whole numbers keep its batch"):
        recipe_batch(path, [], 3, config_cls)
