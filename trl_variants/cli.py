"""``trl-variants`` command line (also ``python -m trl_variants``): ``trl-variants train <method> [--config recipe]
[--flag value ...]``, ``trl-variants recipes``, ``trl-variants {presample,evaluate} --config file.yaml [--flag value
...]`` and ``trl-variants cache {list,clear}``.

``train``, ``presample`` and ``evaluate`` parse their arguments with TRL's ``TrlParser`` (YAML via ``--config``,
command-line flags override it). ``train`` is what ``examples/train_<method>.py`` runs, from inside the package,
with the recipes shipped in it: ``accelerate launch -m trl_variants train erpo ...`` or ``accelerate launch $(which
trl-variants) train erpo ...``, as TRL documents ``accelerate launch $(which trl) grpo``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

# Only light modules at the top (no torch, TRL's trainers or peft): `trl-variants --help`, `train --list` and
# `recipes` answer without them; each command imports what it needs.
from ._validation import check_model_reference
from .scripts import (
    MODEL_SHORTHANDS,
    DataScriptArguments,
    Parser,
    load_datasets,
    load_reward_funcs,
    model_path,
    uses_embedded,
)

USER_ERRORS = (ValueError, FileNotFoundError, TypeError)
"""What ``trl-variants`` prints as one line, ``trl-variants: error: <message>`` (exit code 2), when raised before
training starts: the parser's refusals (a mistyped flag, a value of the wrong type) and the checks of the options,
the data, the checkpoint and the results files, each message naming the option and the fix. ``train``: until
``trainer.train()`` is called (:func:`training_started`; the trainer, its model and offline pass are built and the
checkpoint to resume checked by then); from then on an error is a crash and keeps its traceback. ``presample`` / ``evaluate`` / ``cache`` / ``recipes``:
the whole command. ``--traceback`` (anywhere on the command line) or ``TRL_VARIANTS_TRACEBACK=1`` shows the
traceback of every error; ``main(argv)`` called from Python raises them."""
TRACEBACK_ENV = "TRL_VARIANTS_TRACEBACK"
_training_started = False


def training_started() -> None:
    """The training loop of ``trl-variants train`` starts: later errors are crashes, shown with their traceback."""
    global _training_started
    _training_started = True


@dataclass
class PresampleScriptArguments(DataScriptArguments):
    """Where the pass reads from and writes to."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "Reference model (default: tiny)."})
    output_dir: str = field(default="presampled", metadata={"help": "save_to_disk directory of the result."})
    split: str = field(default="train", metadata={"help": "Which split to presample: 'train' or 'test'."})
    push_to_hub: bool = field(default=False, metadata={"help": "Publish the result as a Hub dataset."})
    hub_dataset_id: str | None = field(default=None, metadata={"help": "Hub dataset repo id (org/name)."})
    hub_private: bool = field(default=False, metadata={"help": "Create the Hub dataset as private."})
    hub_overwrite_card: bool = field(
        default=False,
        metadata={"help": "Replace a README.md already on the Hub dataset that trl-variants did not write (by default "
                          "the push stops before uploading anything)."},
    )


def end_processes(state) -> None:
    """Several processes: wait for all of them, then destroy the process group, as ``trl-variants train`` does
    (``Accelerator.end_training``). Gloo's worker threads otherwise can outlive the interpreter and abort the process at
    exit (SIGABRT, "terminate called without an active exception") after the work is done."""
    if state.num_processes > 1:
        state.wait_for_everyone()
        state.destroy_process_group()


def presample_main(argv: list[str]) -> None:
    from accelerate import PartialState

    from .default import DEFAULT_MODEL_PATH
    from .presample import PresampleConfig, presample

    parser = Parser((PresampleScriptArguments, PresampleConfig), prog="trl-variants presample",
                       description=COMMAND_HELP["presample"], epilog=CONFIG_HELP)
    script_args, config = parser.parse_args_and_config(args=argv)
    if script_args.push_to_hub and not script_args.hub_dataset_id:
        raise ValueError("--push_to_hub needs --hub_dataset_id org/name")
    check_model_reference(script_args.model_name_or_path, "--model_name_or_path")  # before the data and model load
    if config.backend == "vllm":
        from .presample.vllm_backend import check_vllm_setup

        check_vllm_setup(config)  # vllm, a GPU and options vLLM honours: before the data and the model load
    if script_args.reward_model_name_or_path:
        check_model_reference(script_args.reward_model_name_or_path, "--reward_model_name_or_path")
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    if script_args.split == "test" and not uses_embedded(script_args):
        raise ValueError("--split test is only supported for the embedded dataset; pass the test split as "
                         "--dataset_name / --dataset_train_split instead")
    script_args.dataset_test_split = "test"
    model = script_args.model_name_or_path or DEFAULT_MODEL_PATH
    tokenizer = prompt_length_tokenizer(script_args, model)
    if script_args.split == "test":  # the embedded task's fixed test split, prepared exactly as evaluate's
        train = load_eval_dataset(script_args, tokenizer, config.chat_template_kwargs)
    else:
        train, _ = load_datasets(script_args, SimpleNamespace(eval_strategy="no",
                                                              chat_template_kwargs=config.chat_template_kwargs),
                                 tokenizer)
    source = presample_source(script_args)
    state = PartialState()
    rewards = load_reward_funcs(script_args, state.device, config.chat_template_kwargs) if config.num_samples else []
    result = presample(model, None, train, rewards, config,
                       accelerator=state)  # the model on this process's device (GPU), shards split if several
    if state.is_main_process:
        from pathlib import Path

        from .presample import dataset_card

        model_id = script_args.model_name_or_path or "trl_variants tiny default"
        result.save_to_disk(script_args.output_dir)
        card = dataset_card(result, model_id, script_args.hub_dataset_id, source=source)
        (Path(script_args.output_dir) / "README.md").write_text(card)
        print(f"presampled dataset saved to {script_args.output_dir} ({len(result)} rows)")
        if script_args.push_to_hub:
            push_presampled(result, card, script_args.hub_dataset_id, private=script_args.hub_private,
                            overwrite_card=script_args.hub_overwrite_card)
            print(f"pushed to https://huggingface.co/datasets/{script_args.hub_dataset_id}")
    end_processes(state)


def presample_source(script_args) -> dict:
    """What the prompts of ``trl-variants presample`` were taken from, for the dataset card."""
    if uses_embedded(script_args):
        split = script_args.split if script_args.split == "test" else "train"
        source = {"dataset": "embedded (trl_variants.default synthetic arithmetic task)", "split": split,
                  "embedded_train_size": script_args.embedded_train_size,
                  "embedded_test_size": script_args.embedded_test_size, "embedded_seed": script_args.embedded_seed}
    elif getattr(script_args, "datasets", None):  # a mixture loaded with TRL's get_dataset
        from dataclasses import asdict

        source = {"dataset": "mixture", "datasets": [asdict(d) for d in script_args.datasets],
                  "test_split_size": script_args.test_split_size, "split": script_args.dataset_train_split}
    else:
        source = {"dataset": script_args.dataset_name, "config": script_args.dataset_config,
                  "split": script_args.dataset_train_split}
    if script_args.filter_column:
        source["filter"] = f"{script_args.filter_column} in {script_args.filter_values}"
    if getattr(script_args, "filter_prompt_length", None) is not None:
        source["filter_prompt_length"] = f"prompts of at most {script_args.filter_prompt_length} tokens"
    return source


def push_presampled(result, card: str, repo_id: str, private: bool = False, overwrite_card: bool = False) -> None:
    """Publish a presampled dataset with ``card`` as its README.md.

    Order: (1) if the Hub repo already has a README.md with content trl-variants did not write (no ``CARD_MARKER``),
    stop before uploading anything unless ``overwrite_card``; (2) push the data: ``datasets`` writes its YAML
    metadata (``dataset_info``, ``configs``) into the README; (3) push our card last, carrying over that YAML, so the
    README on the Hub is our card and still describes the data files.
    """
    from huggingface_hub import DatasetCard, HfApi

    from .presample.card import CARD_MARKER

    api = HfApi()
    if api.repo_exists(repo_id, repo_type="dataset") and api.file_exists(repo_id, "README.md", repo_type="dataset"):
        existing = DatasetCard.load(repo_id, repo_type="dataset")
        if existing.text.strip() and CARD_MARKER not in existing.text and not overwrite_card:
            raise ValueError(f"https://huggingface.co/datasets/{repo_id} already has a README.md that trl-variants "
                             "did not write; pushing would replace it. Move its content elsewhere or pass "
                             "--hub_overwrite_card to replace it (nothing was uploaded)")
    result.push_to_hub(repo_id, private=private)
    ours = DatasetCard(card)
    pushed = DatasetCard.load(repo_id, repo_type="dataset").data.to_dict()
    mine = ours.data.to_dict()
    for key, value in pushed.items():
        if key == "tags":
            ours.data["tags"] = list(dict.fromkeys([*(mine.get("tags") or []), *(value or [])]))
        elif key not in mine:
            ours.data[key] = value
    ours.push_to_hub(repo_id, repo_type="dataset", commit_message="trl-variants presample: dataset card")


@dataclass
class EvaluateScriptArguments(DataScriptArguments):
    """What to evaluate, on what, and where the report goes."""

    models: list[str] = field(
        default_factory=list,
        metadata={"help": "Model paths / Hub ids; 'tiny' (or 'default') names the shipped tiny model (the default)."},
    )
    model_names: list[str] | None = field(default=None, metadata={"help": "Display names, one per model."})
    base_model: str | None = field(default=None, metadata={"help": "Base model for keep / exploration rates."})
    reference_model: str | None = field(default=None, metadata={"help": "Reference for KL on the samples."})
    max_prompts: int | None = field(default=None, metadata={"help": "Evaluate the first N prompts only."})
    output_dir: str = field(
        default="eval",
        metadata={"help": "Where results.json/.md and the plots go, and chunks/<model name>.jsonl: each model's "
                          "finished chunks, from which an interrupted run resumes when rerun with the same settings."},
    )
    restart: bool = field(
        default=False,
        metadata={"help": "Discard the finished chunks an earlier run left in output_dir/chunks and start over (by "
                          "default they are read back, and a file from other settings is refused)."},
    )
    correctness_func: str | None = field(
        default=None,
        metadata={"help": "The reward function whose value > 0 counts a sample as correct (greedy, avg@k, pass@k): "
                          "a --reward_funcs name or a dotted path (added to the reward functions if not listed), or "
                          "'reward_model' to count the --reward_model_name_or_path score > 0 as correct. Default: "
                          "accuracy_reward (the recipes' training reward), or the only reward function. The other "
                          "reward functions are reported beside it (mean per function), never summed into it."},
    )
    device: str | None = field(
        default=None,
        metadata={"help": "Where the models go in a single process ('cuda:1', 'cpu'); default: the accelerator "
                          "(the GPU when there is one, as Accelerate picks it). Under accelerate launch each "
                          "process uses its own device."},
    )
    use_cpu: bool = field(default=False, metadata={"help": "Evaluate on the CPU even when a GPU is available."})
    dtype: str | None = field(
        default=None,
        metadata={"help": "dtype the models load in: 'bfloat16', 'float16', 'float32' or 'auto' (the checkpoint's); "
                          "default: transformers' default."},
    )
    chat_template_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Extra apply_chat_template arguments for conversational prompts, as GRPOConfig's (a "
                          "JSON dict, e.g. '{\"enable_thinking\": false}')."},
    )

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.chat_template_kwargs, str):
            try:
                self.chat_template_kwargs = json.loads(self.chat_template_kwargs)
            except ValueError as e:
                raise ValueError(f"--chat_template_kwargs must be a JSON dict, got {self.chat_template_kwargs!r} "
                                 f"({e})") from e
        if self.chat_template_kwargs is not None and not isinstance(self.chat_template_kwargs, dict):
            raise ValueError(f"--chat_template_kwargs must be a JSON dict, got {self.chat_template_kwargs!r}")
        if self.dtype is not None and self.dtype not in EVAL_DTYPES:
            raise ValueError(f"--dtype must be one of {list(EVAL_DTYPES)}, got {self.dtype!r}")


EVAL_DTYPES = ("auto", "bfloat16", "float16", "float32")
LENGTH_WARNING_SHARE = 0.1
"""``trl-variants evaluate`` warns when more than this share of a model's samples stopped at max_completion_length."""
# keys of a training recipe that evaluate knows but that mean something else in training: never taken from it
_TRAINING_MEANING = ("output_dir", "seed", "generation_batch_size")
# the keys naming a recipe's data set, and the ones that select its training rows or only fit it: a --dataset_name /
# --datasets on the command line (a benchmark, evaluated whole) replaces all of them
_DATASET_KEYS = ("dataset_name", "datasets", "dataset_config", "prompt_regex", "filter_column", "filter_values",
                 "filter_prompt_length")


def _training_keys() -> set[str]:
    """Every option a training recipe may hold: the script arguments, ModelConfig and each method's config."""
    from dataclasses import fields

    from trl import ModelConfig

    from .registry import REGISTRY, method_classes
    from .scripts import TrainScriptArguments

    classes = [TrainScriptArguments, ModelConfig] + [method_classes(m)[1] for m in REGISTRY]
    return {f.name for cls in classes for f in fields(cls)}


def _given(argv: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def recipe_for_evaluation(recipe: dict, argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """``(options, ignored keys, notes)``: a training recipe's keys as ``trl-variants evaluate`` options. Its model
    (``model_name_or_path`` -> ``models``), data, prompt, reward and sampling settings (``temperature`` ->
    ``temperatures``, ``max_completion_length``, ``top_p``, ``chat_template_kwargs``, ``dtype``...) are taken;
    training-only keys are ignored (returned), as are ``output_dir`` / ``seed`` / ``generation_batch_size``, which
    mean something else in training; a key neither command knows is kept, so the parser refuses it. A
    ``--dataset_name`` / ``--datasets`` in ``argv`` replaces the recipe's data set and the keys that select its
    training rows or only fit it (``dataset_config``, ``prompt_regex``, ``filter_*``): a benchmark is evaluated
    whole."""
    from dataclasses import fields

    from .evaluate import EvalConfig

    known = {f.name for cls in (EvaluateScriptArguments, EvalConfig) for f in fields(cls)}
    training = _training_keys()
    options, ignored, notes = {}, [], []
    for key, value in recipe.items():
        if key == "model_name_or_path":
            options.setdefault("models", [value])
        elif key == "temperature":
            options.setdefault("temperatures", [value])
        elif key in _TRAINING_MEANING or (key not in known and key in training):
            ignored.append(key)
        else:
            options[key] = value
    if _given(argv, "--dataset_name", "--datasets"):
        replaced = [k for k in _DATASET_KEYS if k in options]
        for key in replaced:
            del options[key]
        if replaced:
            notes.append(f"the data set given on the command line replaces the recipe's {', '.join(replaced)}")
    if "output_dir" in recipe and not _given(argv, "--models"):
        notes.append(f"the recipe trains into output_dir {recipe['output_dir']}: evaluate that model with --models "
                     f"{recipe['output_dir']} (this run evaluates {(options.get('models') or ['tiny'])[0]})")
    return options, ignored, notes


def parse_evaluate_args(argv: list[str]):
    """``(script_args, config)`` of ``trl-variants evaluate``: TrlParser over the command line, ``--config`` being
    an evaluate YAML or a training recipe (a path or a shipped recipe's name, :func:`~trl_variants.scripts.
    resolve_recipe`) read by :func:`recipe_for_evaluation`, which prints what it ignored. Flags override the YAML."""
    import os
    import tempfile

    import yaml

    from .evaluate import EvalConfig
    from .scripts import recipe_name, resolve_recipe

    parser = Parser((EvaluateScriptArguments, EvalConfig), prog="trl-variants evaluate",
                       description=COMMAND_HELP["evaluate"], epilog=EVALUATE_CONFIG_HELP)
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[i:i + 1] = ["--config", arg.split("=", 1)[1]]
            break
    if "--config" not in argv:
        return parser.parse_args_and_config(args=argv)
    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise ValueError("--config needs a value: an evaluate YAML, a training recipe's path or a shipped recipe's "
                         "name (`trl-variants recipes`)")
    value = argv[i + 1]
    try:
        path = resolve_recipe(value)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"trl-variants evaluate: --config {e}") from None
    recipe = yaml.safe_load(path.read_text())
    rest = argv[:i] + argv[i + 2:]
    if not isinstance(recipe, dict):
        return parser.parse_args_and_config(args=["--config", str(path), *rest])
    options, ignored, notes = recipe_for_evaluation(recipe, rest)
    if os.environ.get("RANK", "0") == "0":
        shipped = f" (the shipped recipe {recipe_name(path)})" if str(path) != value else ""
        if ignored:
            print(f"--config {value}{shipped}: a training recipe; its model, data, prompt, reward and sampling "
                  f"settings are used, its training-only keys ignored: {', '.join(ignored)}", flush=True)
        for note in notes:
            print(f"--config {value}: {note}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        mapped = os.path.join(tmp, "evaluate.yaml")
        with open(mapped, "w") as f:
            yaml.safe_dump(options, f)
        return parser.parse_args_and_config(args=["--config", mapped, *rest])


def check_correctness_flags(script_args) -> str:
    """The name of the function that decides correctness (``"reward_model"`` for the reward model's score), checked
    before anything loads: a reward model alone is refused unless ``--correctness_func reward_model``."""
    names, rm = list(script_args.reward_funcs or []), script_args.reward_model_name_or_path
    chosen = script_args.correctness_func
    if chosen == "reward_model":
        if not rm:
            raise ValueError("--correctness_func reward_model counts the reward model's score > 0 as correct, but no "
                             "--reward_model_name_or_path is given: add it, or name a reward function")
        return chosen
    if chosen is not None:
        return chosen
    if "accuracy_reward" in names:
        return "accuracy_reward"
    if rm and not names:
        raise ValueError("--reward_model_name_or_path is not supported by evaluate as the judge of correctness "
                         "unless asked: evaluate counts a sample correct when one function's value is > 0 "
                         "(accuracy, pass@k), which a reward model's score does not mean. Add a verifiable reward "
                         "function (--reward_funcs accuracy_reward; the reward model's mean score is then reported "
                         "beside it), or pass --correctness_func reward_model to count score > 0 as correct")
    if len(names) == 1 and not rm:
        return names[0]
    raise ValueError(f"evaluate counts a sample correct from one reward function, and none of --reward_funcs {names} "
                     "is accuracy_reward: name it with --correctness_func NAME (the others are reported beside it, "
                     "never summed into correctness)")


def check_device_flags(script_args, num_processes: int) -> str | None:
    """The device of a single-process evaluation (``--device``, ``cpu`` for ``--use_cpu``, or None: the
    accelerator); refused under several processes, which each use their own."""
    if script_args.device and script_args.use_cpu and script_args.device != "cpu":
        raise ValueError(f"--use_cpu and --device {script_args.device} disagree: give one")
    if num_processes > 1 and (script_args.device or script_args.use_cpu):
        raise ValueError("--device / --use_cpu pick the device of a single process; under accelerate launch each of "
                         f"the {num_processes} processes uses its own (launch with `accelerate launch --cpu` for the "
                         "CPU): drop the flag")
    return "cpu" if script_args.use_cpu else script_args.device


def length_limit_warning(result: dict, limit_share: float = LENGTH_WARNING_SHARE) -> str | None:
    """A warning naming the share of ``result``'s samples that stopped at max_completion_length without an
    end-of-sequence token (their answers are cut off), when above ``limit_share``; None otherwise."""
    k, n = result["config"]["k"], result["num_prompts"]
    parts = [("greedy", result["greedy_stopped_at_limit"], n)] if "greedy_stopped_at_limit" in result else []
    parts += [(f"T={t}", e["stopped_at_limit"], n * k) for t, e in result["temperatures"].items()
              if "stopped_at_limit" in e]
    total = sum(m for _, _, m in parts)
    if not total:
        return None
    share = sum(s * m for _, s, m in parts) / total
    if share <= limit_share:
        return None
    limit = result["config"]["max_completion_length"]
    detail = ", ".join(f"{label} {100 * s:.0f}%" for label, s, _ in parts)
    return (f"warning: {result['name']}: {100 * share:.0f}% of samples stopped at max_completion_length={limit} "
            f"without finishing ({detail}); their answers are cut off and count as wrong: raise "
            "--max_completion_length")


def evaluate_main(argv: list[str]) -> None:
    from pathlib import Path

    from accelerate import PartialState
    from tqdm.auto import tqdm

    from .default import DEFAULT_MODEL_PATH
    from .evaluate import ResultsFile, check_backend, evaluate, write_report

    script_args, config = parse_evaluate_args(argv)  # (without matplotlib the plots are skipped with a note)
    check_backend(config.backend)  # --backend vllm without vllm or a GPU: before any data or model loads
    correctness = check_correctness_flags(script_args)  # before any data or model loads
    raw_models, script_args.models = script_args.models, [model_path(m) for m in script_args.models]
    script_args.base_model = model_path(script_args.base_model)
    script_args.reference_model = model_path(script_args.reference_model)
    for option, value in [*(("--models", m) for m in script_args.models), ("--base_model", script_args.base_model),
                          ("--reference_model", script_args.reference_model)]:
        check_model_reference(value, option)  # every model, before any of them is loaded or evaluated
    if script_args.reward_model_name_or_path:
        check_model_reference(script_args.reward_model_name_or_path, "--reward_model_name_or_path")
    models = script_args.models or [DEFAULT_MODEL_PATH]
    names = script_args.model_names or [  # evaluate's default name; --models tiny: "tiny", not its directory's
        "tiny" if m in MODEL_SHORTHANDS and model_path(m) != m else Path(m).name for m in raw_models or models]
    if len(names) != len(models):
        raise ValueError(f"--model_names has {len(names)} entries for {len(models)} --models")
    all_names = (["base"] if script_args.base_model else []) + list(names)
    repeated = sorted({n for n in all_names if all_names.count(n) > 1})
    if repeated:  # a name is a model's row in the table and its chunks file in output_dir/chunks
        raise ValueError(f"two evaluations would be named {repeated} (a model's name is its directory name, or "
                         "'base' for --base_model): give each model its own name with --model_names")
    if not script_args.restart:  # a damaged finished-chunks file: refused now, before any model loads
        for name in all_names:
            ResultsFile.check(chunks_file(script_args.output_dir, name))
    state = PartialState(cpu=script_args.use_cpu)
    device = check_device_flags(script_args, state.num_processes)
    if script_args.correctness_func not in (None, "reward_model") and (
            script_args.correctness_func not in script_args.reward_funcs):
        script_args.reward_funcs = [script_args.correctness_func, *script_args.reward_funcs]
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    kwargs = script_args.chat_template_kwargs
    dataset = load_eval_dataset(script_args, prompt_length_tokenizer(script_args, models[0]), kwargs)
    if script_args.max_prompts:
        dataset = dataset.select(range(min(script_args.max_prompts, len(dataset))))
    accelerator = state if state.num_processes > 1 else None
    rewards = load_reward_funcs(script_args, state.device if device is None else device, kwargs)
    judge = rewards[0] if correctness == "reward_model" else rewards[
        int(bool(script_args.reward_model_name_or_path)) + script_args.reward_funcs.index(correctness)]
    # (name, model, is the base); the base first: the others' keep / exploration rates are measured against it
    jobs = [("base", script_args.base_model, True)] if script_args.base_model else []
    jobs += [(name, model, False) for name, model in zip(names, models, strict=True)]
    bar = tqdm(total=len(jobs), desc="models", unit="model", dynamic_ncols=True,
               disable=len(jobs) < 2 or not state.is_main_process or not config.show_progress)
    base, results = None, []
    for name, model, is_base in jobs:
        bar.set_postfix_str(name)
        results.append(evaluate(model, None, dataset, rewards, config, name=name, base_results=base,
                                reference_model=script_args.reference_model, accelerator=accelerator,
                                results_file=chunks_file(script_args.output_dir, name), restart=script_args.restart,
                                correctness_func=judge, device=device, dtype=script_args.dtype,
                                chat_template_kwargs=kwargs))
        base = results[-1] if is_base else base
        bar.update()
    bar.close()
    if state.is_main_process:
        paths = write_report(results, script_args.output_dir)
        print(open(paths["markdown"]).read())
        print("wrote " + ", ".join(paths.values()))
        for res in results:
            warning = length_limit_warning(res)
            if warning:
                print(warning, file=sys.stderr, flush=True)
    end_processes(state)


def chunks_file(output_dir, name: str):
    """Where ``trl-variants evaluate`` appends a model's finished chunks: ``<output_dir>/chunks/<name>.jsonl``."""
    from pathlib import Path

    return Path(output_dir) / "chunks" / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") + ".jsonl")


def prompt_length_tokenizer(script_args, model: str):
    """The tokenizer ``--filter_prompt_length`` counts prompt tokens with (``model``'s), or None without the flag."""
    if script_args.filter_prompt_length is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(model))


def load_eval_dataset(script_args, tokenizer=None, chat_template_kwargs: dict | None = None):
    """The evaluation split: the embedded task's fixed test split, or ``dataset_test_split`` of the dataset, with
    the same columns, prompt templating and checks as the train split; ``tokenizer`` counts prompt tokens for
    ``--filter_prompt_length`` (evaluate: the first of ``--models``). A benchmark with a test split only (MATH-500)
    loads: the train split is not read."""
    import copy

    if not uses_embedded(script_args) and not getattr(script_args, "datasets", None):
        script_args = copy.copy(script_args)  # load_datasets needs a train split: the test split stands in
        script_args.dataset_train_split = script_args.dataset_test_split
    _, test = load_datasets(script_args, SimpleNamespace(eval_strategy="steps",
                                                         chat_template_kwargs=chat_template_kwargs), tokenizer)
    if test is None:
        raise ValueError(f"dataset {script_args.dataset_name!r} has no split {script_args.dataset_test_split!r}: set "
                         "--dataset_test_split")
    return test


# --- trl-variants cache ------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"[0-9a-f]{20}")  # an entry's directory name: its cache key (presample.cache.cache_key)


def cache_entries(root) -> list:
    """The offline-pass cache entries under ``root``: the directories named by a cache key (nothing else there is
    listed or removed), oldest first."""
    from pathlib import Path

    root = Path(root)
    if not root.is_dir():
        return []
    entries = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and _ENTRY.fullmatch(p.name)]
    return sorted(entries, key=lambda p: p.stat().st_mtime)


def _entry_info(entry) -> dict:
    """What ``cache list`` shows of one entry, read from its ``options.json`` and its dataset's info (no data
    loaded)."""
    size, mtime = 0, entry.stat().st_mtime
    for f in entry.rglob("*"):
        if f.is_file() and not f.is_symlink():
            stat = f.stat()
            size, mtime = size + stat.st_size, max(mtime, stat.st_mtime)
    try:
        options = json.loads((entry / "options.json").read_text())
    except (OSError, ValueError):
        options = {}
    options = options if isinstance(options, dict) else {}
    shards = len(list(entry.glob("shard-*.json")))
    if (entry / "dataset" / "state.json").exists():
        status = "complete"
    else:
        status = f"{shards}/{options.get('shards', '?')} shards"
    model = ""
    try:
        description = json.loads((entry / "dataset" / "dataset_info.json").read_text())["description"]
        from .presample import METADATA_KEY

        model = json.loads(description)[METADATA_KEY]["model"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    key_options = options.get("options")
    samples = key_options.get("num_samples", "?") if isinstance(key_options, dict) else "?"
    return {"key": entry.name, "status": status, "rows": options.get("rows", "?"), "samples": samples, "size": size,
            "modified": time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime)), "model": model}


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def _entries_text(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def cache_main(argv: list[str]) -> None:
    from pathlib import Path

    from .presample.cache import default_cache_dir

    parser = argparse.ArgumentParser(prog="trl-variants cache", description=COMMAND_HELP["cache"])
    sub = parser.add_subparsers(dest="action", metavar="{list,clear}", required=True)
    where = ("The cache directory (a trainer's presample_cache_dir, presample's --cache_dir); default: "
             "$TRL_VARIANTS_CACHE or ~/.cache/trl_variants/presample.")
    show = sub.add_parser("list", help="List the entries: key, status, rows, samples per prompt, size, last "
                                       "write, model.", description="List the offline-pass cache entries.")
    show.add_argument("--cache_dir", default=None, help=where)
    clear = sub.add_parser("clear", help="Remove entries (all, or the KEYs given); asks first unless --yes.",
                           description="Remove offline-pass cache entries (the directories named by a cache key; "
                                       "nothing else in the directory). Do not run it while a pass is writing.")
    clear.add_argument("keys", nargs="*", metavar="KEY", help="Entries to remove (default: all), as `list` shows.")
    clear.add_argument("--cache_dir", default=None, help=where)
    clear.add_argument("--yes", "-y", action="store_true", help="Remove without asking.")
    args = parser.parse_args(argv)
    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    entries = cache_entries(root)
    if args.action == "list":
        infos = [_entry_info(e) for e in entries]
        total = sum(i["size"] for i in infos)
        print(f"offline-pass cache {root}: {_entries_text(len(infos))}, {_size(total)}"
              + ("" if root.is_dir() else " (the directory does not exist)"))
        if infos:
            print(f"{'KEY':<20}  {'STATUS':<12}  {'ROWS':>6}  {'SAMPLES':>7}  {'SIZE':>9}  {'MODIFIED':<16}  MODEL")
            for i in infos:
                print(f"{i['key']:<20}  {i['status']:<12}  {i['rows']!s:>6}  {i['samples']!s:>7}  "
                      f"{_size(i['size']):>9}  {i['modified']:<16}  {i['model']}")
        return
    if args.keys:
        by_key = {e.name: e for e in entries}
        unknown = [k for k in args.keys if k not in by_key]
        if unknown:
            raise SystemExit(f"trl-variants cache clear: no entry {', '.join(map(repr, unknown))} in {root} "
                             "(`trl-variants cache list` shows the keys); nothing removed")
        entries = [by_key[k] for k in dict.fromkeys(args.keys)]
    if not entries:
        print(f"offline-pass cache {root}: nothing to remove")
        return
    size = sum(_entry_info(e)["size"] for e in entries)
    what = f"{_entries_text(len(entries))} ({_size(size)}) from {root}"
    if not args.yes:
        if not (sys.stdin is not None and sys.stdin.isatty()):
            print(f"trl-variants cache clear: would remove {what}; pass --yes to remove them (nothing removed)",
                  file=sys.stderr)
            raise SystemExit(1)
        if input(f"Remove {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return
    for entry in entries:
        shutil.rmtree(entry)
    print(f"removed {what}")


# --- trl-variants train / recipes -----------------------------------------------------------------------------------

_HEADER_PROCESSES = re.compile(r"^#\s*processes:\s*(\d+)")


def _describe(path) -> tuple[str, str]:
    """``(processes, first header line)`` of a shipped YAML, for the listing."""
    lines = path.read_text().splitlines()
    first = lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""
    processes = next((m.group(1) for m in map(_HEADER_PROCESSES.match, lines) if m), "")
    return processes, first


def recipes_text(width: int = 118) -> str:
    """What ``trl-variants recipes`` / ``trl-variants train --list`` print: every shipped YAML by name."""
    from .scripts import DEFAULT_RECIPE, METHODS, RECIPES_DIR, recipe_name, shipped_recipes

    name_width = max(len(recipe_name(p)) for p in shipped_recipes())

    def row(path, note: str | None) -> str:
        text = f"  {recipe_name(path):<{name_width}}  {'' if note is None else f'{note:<12} '}{_describe(path)[1]}"
        return text if len(text) <= width else text[:width - 3] + "..."

    lines = [f"Recipes shipped with trl-variants, in {RECIPES_DIR} (a clone's configs/).", "",
             "Training recipes: trl-variants train METHOD --config NAME   (NAME, NAME.yaml or METHOD/NAME; without "
             f"--config: METHOD/{DEFAULT_RECIPE})"]
    for method in METHODS:
        for path in shipped_recipes(method):
            processes = _describe(path)[0]
            note = "default" if path.stem == DEFAULT_RECIPE else f"{processes} processes" if processes else ""
            lines.append(row(path, note))
    lines += ["", "Accelerate configs: accelerate launch --config_file $(trl-variants recipes --path accelerate/NAME) "
              "-m trl_variants train ..."]
    lines += [row(path, None) for path in shipped_recipes("accelerate")]
    lines += ["", "A recipe's header gives its launch command from a clone (examples/train_METHOD.py --config "
              "configs/METHOD/NAME.yaml); installed, the same run is", "  accelerate launch --config_file "
              "$(trl-variants recipes --path accelerate/zero2) $(which trl-variants) train erpo --config "
              "erpo/qwen2.5-math-7b",
              "`trl-variants recipes --path NAME` prints a recipe's file (copy it to change it; --config takes a "
              "path too)."]
    return "\n".join(lines)


def recipes_main(argv: list[str]) -> None:
    from .scripts import resolve_recipe

    parser = argparse.ArgumentParser(prog="trl-variants recipes", description=COMMAND_HELP["recipes"])
    parser.add_argument("--path", metavar="NAME", default=None,
                        help="Print the file of the shipped recipe or accelerate config NAME (e.g. "
                             "erpo/qwen2.5-math-7b, accelerate/zero2) instead of the list.")
    args = parser.parse_args(argv)
    if args.path is None:
        print(recipes_text())
        return
    try:
        print(resolve_recipe(args.path, files=False))
    except (FileNotFoundError, ValueError) as e:
        print(f"trl-variants recipes: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def train_usage() -> str:
    from .scripts import DEFAULT_RECIPE, METHODS

    return "\n".join([
        "usage: trl-variants train {" + ",".join(METHODS) + "} [--config RECIPE] [--option value ...]",
        "       trl-variants train --list",
        "", COMMAND_HELP["train"], "",
        "methods: erpo (ERPOTrainer), eepo (EEPOTrainer), dph (DPHTrainer), apo (APOTrainer), grpo (TRL's "
        "GRPOTrainer, the baseline)",
        f"--config RECIPE: a YAML file, or a shipped recipe by name (erpo/qwen2.5-math-7b, or qwen2.5-math-7b.yaml); "
        f"default: METHOD/{DEFAULT_RECIPE}, the embedded task on a CPU, offline. Flags override the YAML.",
        "--list: list the shipped recipes (also `trl-variants recipes`).",
        "",
        "Before any data or model loads, train checks what the run needs (the vllm / deepspeed / tracker extras, the "
        "wandb login, a Hub id and token for --push_to_hub) and lists what is missing; a recipe launched on another "
        "process count than its header's keeps its global batch (--keep_recipe_batch false: the per-device values as "
        "written). --resume_from_checkpoint true resumes the last checkpoint of --output_dir.",
        "",
        "Run `trl-variants train METHOD --help` for every option of a method. Several processes, as for TRL's "
        "`accelerate launch $(which trl) grpo`:",
        "  accelerate launch -m trl_variants train erpo [--config RECIPE] [--option value ...]",
        "  accelerate launch $(which trl-variants) train erpo [--config RECIPE] [--option value ...]",
    ])


def train_cli(argv: list[str]) -> None:
    from .scripts import METHODS, train_main

    if not argv or argv[0] in ("-h", "--help"):
        print(train_usage(), file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    if argv[0] in ("--list", "-l"):
        print(recipes_text())
        return
    if argv[0] not in METHODS:
        problem = (f"expected a method before the options, got {argv[0]!r}" if argv[0].startswith("-")
                   else f"unknown method {argv[0]!r}")
        print(f"{train_usage()}\n\ntrl-variants train: error: {problem}; choose one of: {', '.join(METHODS)}",
              file=sys.stderr)
        raise SystemExit(2)
    train_main(argv[0], argv=argv[1:], prog=f"trl-variants train {argv[0]}")


COMMANDS = {"train": train_cli, "recipes": recipes_main, "presample": presample_main, "evaluate": evaluate_main,
            "cache": cache_main}
COMMAND_HELP = {
    "train": "Train with ERPO, EEPO, DPH-RL, A*-PO, a combination of parts or TRL's GRPO "
             "(`train erpo|eepo|dph|apo|composed|grpo`) on a shipped recipe "
             "(--config NAME; default: the tiny CPU one) or your YAML, flags overriding it: the example scripts, "
             "inside the package.",
    "recipes": "List the recipes and accelerate configs shipped in the package (`--path NAME`: a recipe's file).",
    "presample": "Run the offline reference pass (stage 1 of A*-PO and DPH-RL, ERPO's reference prompt "
                 "log-likelihoods) over a dataset and save (or push) the result with its dataset card.",
    "evaluate": "Sample and score models on a test split: greedy accuracy, avg@k / pass@k per temperature, entropy "
                "and KL; writes results.json, results.md and, with matplotlib ('trl-variants[plots]'), plots.",
    "cache": "List (`cache list`) or remove (`cache clear [--yes] [KEY ...]`) the offline pass's cached results "
             "($TRL_VARIANTS_CACHE, default ~/.cache/trl_variants/presample, or --cache_dir).",
}

CONFIG_HELP = ("--config FILE.yaml: read the options above from a YAML file (keys are the option names without "
               "'--'); flags given on the command line override it.")
EVALUATE_CONFIG_HELP = (CONFIG_HELP + " evaluate also takes a training recipe (a path or a shipped recipe's name, "
                        "e.g. erpo/tiny_cpu; `trl-variants recipes` lists them): its model (model_name_or_path), "
                        "data, prompt, reward and sampling settings (temperature, max_completion_length, top_p...) "
                        "are used and its training-only keys are ignored (listed when it starts); a --dataset_name "
                        "on the command line replaces the recipe's data set with its filter_* / prompt_regex / "
                        "dataset_config (a benchmark is evaluated whole).")


def usage() -> str:
    lines = [f"usage: trl-variants {{{','.join(COMMANDS)}}} [--option value ...]   (or: python -m trl_variants ...)",
             "", "commands:"]
    lines += [f"  {name:<10} {COMMAND_HELP[name]}" for name in COMMANDS]
    lines += ["", "Run `trl-variants COMMAND --help` for every option of a command. train, presample and evaluate "
              "take their options from a YAML file (--config FILE.yaml) and/or flags (flags override the file).",
              "Several processes: accelerate launch -m trl_variants train erpo ...   (or: accelerate launch $(which "
              "trl-variants) train erpo ...)",
              f"An error before training starts prints one line with its fix; --traceback (or {TRACEBACK_ENV}=1) "
              "shows the traceback."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """The ``trl-variants`` command. Run as the command (``argv`` None: ``sys.argv``), a user error before training
    starts (:data:`USER_ERRORS`) prints one line and exits with code 2; ``main(argv)`` called from Python raises it,
    as ``--traceback`` does."""
    global _training_started
    command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    if "--traceback" in argv:
        argv = [a for a in argv if a != "--traceback"]
        show_traceback = True
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0)
    if not argv or argv[0] not in COMMANDS:
        problem = ("no command given" if not argv else
                   f"expected a command before the options, got {argv[0]!r}" if argv[0].startswith("-") else
                   f"unknown command {argv[0]!r}")
        print(f"{usage()}\n\ntrl-variants: error: {problem}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        raise SystemExit(2)
    _training_started = False
    try:
        COMMANDS[argv[0]](argv[1:])
    except USER_ERRORS as e:  # see USER_ERRORS for the boundary
        if show_traceback or _training_started or not command_line:
            raise
        print(f"trl-variants: error: {str(e).strip() or type(e).__name__}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
