"""Every YAML under ``configs/`` as the examples read it: no model, no dataset, no network.

A training recipe (``configs/<algorithm>/*.yaml``) must parse with the examples' own parser
(``trl_variants.training.parse_args``: TrlParser over the script arguments, the trainer's config and ModelConfig) into
the trainer's config, and its batch arithmetic must give the numbers its header states for the process count the
header names. The header convention, one ``# key: integer`` line each in the leading comment block (text may follow
the number)::

    # processes: 8               processes the recipe is written for (its launch command's accelerate config)
    # rollout_prompts: 512       prompts per rollout (generation) batch
    # completions_per_step: 1024 completions per optimizer step, all processes together
    # steps_per_rollout: 4       optimizer steps per rollout batch
    # train_prompts: 7500        training prompts (only for recipes that train for num_train_epochs)
    # rollout_batches: 240       rollout batches in the whole run (what the papers call steps)
    # optimizer_steps: 960       optimizer steps in the whole run (what TRL's max_steps counts)
    # pef_rows_per_step: 256     DPH-RL only: D_pef rows per optimizer step

The values are the papers' (docs/recipes.md); the arithmetic is computed here from the parsed fields for the stated
process count, because GRPOConfig derives ``generation_batch_size`` for the process count of the test (one).
The ``tiny_cpu.yaml`` defaults carry no header: they are checked for 1 process and for the 2 of
``configs/accelerate/multi_cpu.yaml``. Accelerate configs must load with accelerate's own config class.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
CONFIG_CLASSES = {"erpo": "ERPOConfig", "eepo": "EEPOConfig", "dph": "DPHConfig", "apo": "APOConfig",
                  "composed": "ComposedConfig"}
HEADER_KEYS = ("processes", "rollout_prompts", "completions_per_step", "steps_per_rollout", "train_prompts",
               "rollout_batches", "optimizer_steps", "pef_rows_per_step")
REQUIRED_KEYS = ("processes", "rollout_prompts", "completions_per_step", "steps_per_rollout", "rollout_batches",
                 "optimizer_steps")
TINY = "tiny_cpu.yaml"
_HEADER_LINE = re.compile(r"^#\s*([a-z_]+):\s*(\d+)(?:\s.*)?$")

RECIPES = sorted(p for algorithm in CONFIG_CLASSES for p in (CONFIGS / algorithm).glob("*.yaml"))
PAPER_RECIPES = [p for p in RECIPES if p.name != TINY]
ACCELERATE_CONFIGS = sorted((CONFIGS / "accelerate").glob("*.yaml"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def read_header(path: Path) -> dict[str, int]:
    """The ``# key: integer`` lines (keys of HEADER_KEYS) of the comment block that opens the file."""
    header = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            break
        match = _HEADER_LINE.match(line.strip())
        if match and match.group(1) in HEADER_KEYS:
            key = match.group(1)
            assert key not in header, f"{_rel(path)}: header states {key!r} twice"
            header[key] = int(match.group(2))
    return header


def header_comment(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)


@pytest.fixture
def bf16_anywhere(monkeypatch):
    """The recipes ask for bf16 on GPUs; TrainingArguments refuses bf16 on a machine without one. Pretend the GPU
    supports it, so the recipe is parsed with its own values (bf16: true, use_cpu: false)."""
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)


def parse_recipe(path: Path, algorithm: str | None = None):
    """``(script_args, training_args, model_args)`` exactly as ``examples/train_<algorithm>.py`` parses them."""
    import trl_variants
    from trl_variants.training import parse_args

    config_cls = getattr(trl_variants, CONFIG_CLASSES[algorithm or path.parent.name])
    return parse_args(config_cls, argv=["--config", str(path)])


def batch_arithmetic(path: Path, args, processes: int, train_prompts: int | None = None) -> dict[str, int]:
    """The batch numbers of a parsed recipe on ``processes`` processes; AssertionError where they do not add up."""
    raw = yaml.safe_load(path.read_text())
    where = f"{_rel(path)} on {processes} process(es)"
    group = args.num_generations
    micro, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    if raw.get("generation_batch_size") is not None:  # GRPOConfig derived steps_per_generation for ONE process
        assert raw["generation_batch_size"] % (micro * processes) == 0, \
            f"{where}: generation_batch_size is not a multiple of per_device_train_batch_size x processes"
        per_generation = raw["generation_batch_size"] // (micro * processes)
    else:
        per_generation = raw.get("steps_per_generation") or accumulation
    step_completions = micro * processes * accumulation
    rollout_completions = micro * processes * per_generation
    assert step_completions % group == 0, (
        f"{where}: {micro} x {processes} x {accumulation} = {step_completions} completions per optimizer step "
        f"is not a multiple of num_generations = {group}")
    assert rollout_completions % group == 0, (
        f"{where}: {rollout_completions} completions per rollout batch is not a multiple of num_generations")
    assert per_generation % accumulation == 0, (
        f"{where}: steps_per_generation {per_generation} is not a multiple of gradient_accumulation_steps "
        f"{accumulation}: a rollout batch would end inside an optimizer step")
    numbers = {
        "rollout_prompts": rollout_completions // group,
        "completions_per_step": step_completions,
        "steps_per_rollout": per_generation // accumulation * args.num_iterations,
    }
    if args.max_steps > 0:
        assert args.max_steps % numbers["steps_per_rollout"] == 0, (
            f"{where}: max_steps {args.max_steps} is not a whole number of rollout batches "
            f"({numbers['steps_per_rollout']} optimizer steps each)")
        numbers["optimizer_steps"] = args.max_steps
        numbers["rollout_batches"] = args.max_steps // numbers["steps_per_rollout"]
    else:
        assert train_prompts, f"{where}: trains for num_train_epochs, so its header must state train_prompts"
        assert float(args.num_train_epochs).is_integer(), f"{where}: num_train_epochs must be whole"
        # TRL's RepeatSampler (like VERL's dataloader) drops the incomplete last rollout batch
        numbers["rollout_batches"] = train_prompts // numbers["rollout_prompts"] * int(args.num_train_epochs)
        numbers["optimizer_steps"] = numbers["rollout_batches"] * numbers["steps_per_rollout"]
    if hasattr(args, "pef_batch_size"):
        numbers["pef_rows_per_step"] = args.pef_batch_size * processes * accumulation
    return numbers


def check_recipe(path: Path, algorithm: str | None = None) -> dict[str, int]:
    """Parse a recipe and compare its arithmetic with its header; returns the computed numbers."""
    header = read_header(path)
    missing = [k for k in REQUIRED_KEYS if k not in header]
    assert not missing, f"{_rel(path)}: header lacks {missing} (see this test's docstring for the convention)"
    _, args, _ = parse_recipe(path, algorithm)
    numbers = batch_arithmetic(path, args, header["processes"], header.get("train_prompts"))
    for key, value in numbers.items():
        if key == "pef_rows_per_step" and key not in header:
            raise AssertionError(f"{_rel(path)}: a DPH-RL recipe must state pef_rows_per_step")
        assert header.get(key) == value, (
            f"{_rel(path)}: header says {key}: {header.get(key)}, the recipe gives {value} "
            f"on {header['processes']} processes")
    return numbers


def test_every_algorithm_has_recipes_and_only_the_tiny_defaults_lack_a_header():
    assert {p.parent.name for p in PAPER_RECIPES} == set(CONFIG_CLASSES) - {"composed"}  # parts: no paper of its own
    for path in RECIPES:
        if path.name != TINY:
            assert read_header(path), f"{_rel(path)} has no machine-readable header"


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=_rel)
def test_recipe_parses_and_its_batch_arithmetic_matches_its_header(path, bf16_anywhere):
    numbers = check_recipe(path)
    assert numbers["optimizer_steps"] == numbers["rollout_batches"] * numbers["steps_per_rollout"]


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=_rel)
def test_recipe_header_launch_command_names_this_recipe_and_an_accelerate_config_for_its_processes(path):
    from accelerate.commands.config.config_args import ClusterConfig

    comment, algorithm = header_comment(path), path.parent.name
    assert f"examples/train_{algorithm}.py" in comment, f"{_rel(path)}: no launch command"
    assert CONFIG_CLASSES[algorithm] in (ROOT / "examples" / f"train_{algorithm}.py").read_text()
    assert f"--config {_rel(path)}" in comment, f"{_rel(path)}: the launch command must pass this very file"
    match = re.search(r"--config_file (\S+)", comment)
    assert match, f"{_rel(path)}: the launch command names no accelerate config"
    accelerate_config = ClusterConfig.from_yaml_file(str(ROOT / match.group(1)))
    assert accelerate_config.num_processes == read_header(path)["processes"], (
        f"{_rel(path)}: {match.group(1)} starts {accelerate_config.num_processes} processes, the recipe assumes "
        f"{read_header(path)['processes']}")


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("path", [p for p in RECIPES if p.name == TINY], ids=_rel)
def test_tiny_default_parses_and_divides_for_one_and_two_processes(path, processes):
    _, args, _ = parse_recipe(path)
    assert args.use_cpu and not args.bf16
    assert args.max_steps > 0
    numbers = batch_arithmetic(path, args, processes)
    assert numbers["rollout_batches"] * numbers["steps_per_rollout"] == args.max_steps


def test_the_paper_step_counts_are_rollout_batches(bf16_anywhere):
    """The issue's example: ERPO's 240 steps are rollout batches of 512 prompts, 4 optimizer steps each."""
    numbers = check_recipe(CONFIGS / "erpo" / "qwen2.5-math-7b.yaml")
    assert (numbers["rollout_prompts"], numbers["rollout_batches"], numbers["steps_per_rollout"]) == (512, 240, 4)
    assert numbers["completions_per_step"] == 128 * 8
    apo = check_recipe(CONFIGS / "apo" / "qwen2.5-7B.yaml")
    assert (apo["rollout_prompts"], apo["completions_per_step"], apo["rollout_batches"]) == (256, 128, 25 * 29)


def test_a_wrong_header_is_caught(tmp_path, bf16_anywhere):
    source = CONFIGS / "erpo" / "qwen2.5-math-7b.yaml"
    (tmp_path / "erpo").mkdir()
    wrong = tmp_path / "erpo" / source.name
    wrong.write_text(source.read_text().replace("# rollout_batches: 240", "# rollout_batches: 60"))
    with pytest.raises(AssertionError, match="rollout_batches: 60"):
        check_recipe(wrong)
    text = source.read_text().replace("steps_per_generation: 128", "steps_per_generation: 100")
    wrong.write_text(text)
    with pytest.raises(AssertionError, match="not a multiple of gradient_accumulation_steps"):
        check_recipe(wrong)


def test_an_unknown_field_fails_to_parse(tmp_path, bf16_anywhere):
    """The bug: a recipe field the installed versions do not know (`warmup_ratio` from transformers 5.2
    on, `activation_checkpointing` before 5.23) is refused at parse time. A misspelt field is unknown to every
    version of the supported range, so this holds at both ends of it (scripts/lowest_versions.py)."""
    source = CONFIGS / "erpo" / "qwen2.5-math-7b.yaml"
    wrong = tmp_path / source.name
    wrong.write_text(source.read_text() + "query_kl_coeff: 0.01\n")
    with pytest.raises(ValueError, match="query_kl_coeff"):
        parse_recipe(wrong, "erpo")


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=_rel)
def test_accelerate_config_loads_with_accelerate(path):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    raw = yaml.safe_load(path.read_text())
    for key in ("compute_environment", "distributed_type", "num_processes", "num_machines", "mixed_precision"):
        assert key in raw, f"{_rel(path)} lacks {key}"
    config = ClusterConfig.from_yaml_file(str(path))  # raises on keys accelerate does not know
    assert config.num_processes >= 1 and config.num_machines >= 1
    if config.distributed_type == DistributedType.DEEPSPEED:
        assert raw["deepspeed_config"]["zero_stage"] in (0, 1, 2, 3)
    if config.distributed_type == DistributedType.FSDP:
        assert raw["fsdp_config"]["fsdp_version"] in (1, 2)
    if config.distributed_type == DistributedType.NO:
        assert config.num_processes == 1


def test_eepo_recipe_has_the_papers_kl_and_entropy_coefficients(bf16_anywhere):
    """EEPO App. A: "The KL loss and entropy loss coefficient are set to 1e-4 and 1e-5";
    EEPOConfig itself keeps GRPO's 0 / 0 (so that entropy_gate="never" is exactly GRPOTrainer), the recipe sets them."""
    _, args, _ = parse_recipe(CONFIGS / "eepo" / "qwen2.5-3b.yaml")
    assert args.beta == 1e-4 and args.entropy_coef == 1e-5
    from trl_variants import EEPOConfig

    assert EEPOConfig.beta == 0.0 and EEPOConfig.entropy_coef == 0.0


@pytest.mark.parametrize("path", RECIPES, ids=_rel)
@pytest.mark.usefixtures("bf16_anywhere")
def test_every_recipe_checkpoint_falls_between_rollouts(path):
    """Every recipe's save_steps is a multiple of its optimizer steps per rollout: its checkpoints need no rollout of
    their own (a checkpoint inside a rollout carries each process's micro-batches still to train)."""
    from trl_variants._rollout_state import inside_a_rollout, rollout_steps

    _, args, _ = parse_recipe(path)
    if str(getattr(args.save_strategy, "value", args.save_strategy)) == "steps":
        assert not inside_a_rollout(int(args.save_steps), args), (
            f"{_rel(path)}: save_steps {args.save_steps} is not a multiple of {rollout_steps(args)}")
