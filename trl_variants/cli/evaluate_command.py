"""``trl-variants evaluate``: parse (an evaluate YAML or a training recipe, flags overriding it), check every option
before anything loads, evaluate each model (:func:`trl_variants.evaluation.evaluate`) and write the report."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field

from .._validation import check_model_reference
from ..data import DataScriptArguments, load_eval_dataset, load_reward_funcs
from ..training.arguments import training_keys
from ..training.model_options import MODEL_SHORTHANDS, model_path
from .help import COMMAND_HELP, EVALUATE_CONFIG_HELP
from .parser import Parser, parse_with_recipe
from .presample_command import end_processes, prompt_length_tokenizer


@dataclass
class EvaluateScriptArguments(DataScriptArguments):
    """What to evaluate, on what, and where the report goes."""

    models: list[str] = field(
        default_factory=list,
        metadata={"help": "Model paths / Hub ids; 'tiny' (or 'default') names the shipped tiny model (the default, "
                          "unless --base_model is given alone: then only the base is evaluated)."},
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

    from ..evaluation import EvalConfig

    known = {f.name for cls in (EvaluateScriptArguments, EvalConfig) for f in fields(cls)}
    training = training_keys()
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
    an evaluate YAML or a training recipe (a path or a shipped recipe's name,
    :func:`~trl_variants.recipe_catalog.resolve_recipe`) read by :func:`recipe_for_evaluation`, which prints what
    it ignored. Flags override the YAML."""
    import os

    from ..evaluation import EvalConfig
    from ..recipe_catalog import recipe_name

    parser = Parser((EvaluateScriptArguments, EvalConfig), prog="trl-variants evaluate",
                       description=COMMAND_HELP["evaluate"], epilog=EVALUATE_CONFIG_HELP)

    def to_options(recipe, path, value, rest):
        options, ignored, notes = recipe_for_evaluation(recipe, rest)
        if os.environ.get("RANK", "0") == "0":
            shipped = f" (the shipped recipe {recipe_name(path)})" if str(path) != value else ""
            if ignored:
                print(f"--config {value}{shipped}: a training recipe; its model, data, prompt, reward and sampling "
                      f"settings are used, its training-only keys ignored: {', '.join(ignored)}", flush=True)
            for note in notes:
                print(f"--config {value}: {note}", flush=True)
        return options

    return parse_with_recipe(parser, argv, "evaluate", to_options)


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
                         f"the {num_processes} processes uses its own (several CPU processes: accelerate launch --config_file "
                         "$(trl-variants recipes --path accelerate/multi_cpu); --cpu starts one): drop the flag")
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

    from ..default import DEFAULT_MODEL_PATH
    from ..evaluation import ResultsFile, check_backend, evaluate, write_report

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
    # no --models: the shipped tiny model, unless --base_model alone is asked for (then only the base, not twice)
    models = script_args.models or ([] if script_args.base_model else [DEFAULT_MODEL_PATH])
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
    first = models[0] if models else script_args.base_model  # whose tokenizer measures the prompt lengths
    dataset = load_eval_dataset(script_args, prompt_length_tokenizer(script_args, first), kwargs)
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

