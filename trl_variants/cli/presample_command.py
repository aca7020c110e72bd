"""``trl-variants presample``: the offline reference pass over a dataset, saved (or pushed) with its dataset card.
Also what ``evaluate`` shares with it: :func:`end_processes` and :func:`prompt_length_tokenizer`."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from .._card import public_name
from .._validation import check_model_reference
from ..data import DataScriptArguments, load_datasets, load_eval_dataset, load_reward_funcs, uses_embedded
from ..training.arguments import training_keys
from .help import COMMAND_HELP, CONFIG_HELP
from .parser import Parser, parse_with_recipe


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


# a training recipe's keys that mean something else in the pass (the trainer's batch; its colocated engine's share)
_TRAINING_MEANING = ("output_dir", "generation_batch_size", "vllm_gpu_memory_utilization", "push_to_hub")
# the method's fields that become the pass's own options (other names)
_CONSUMED = ("num_presamples", "num_value_samples", "presample_generation_batch_size", "presample_shard_size",
             "presample_cache_dir")
# what the trainer samples with, as its offline pass takes it (_offline.sampling_options): default values included
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
             "generation_kwargs", "chat_template_kwargs", "seed")


def recipe_method(recipe: dict, path) -> str:
    """The method a training recipe trains: its folder (``configs/<method>/``), else its method-only keys."""
    from pathlib import Path

    from ..registry import REGISTRY

    folder = Path(path).parent.name
    if folder in REGISTRY or folder == "composed":
        return folder
    found = [m for m, key in (("dph", "num_presamples"), ("apo", "num_value_samples")) if key in recipe]
    if len(found) != 1:
        raise ValueError(f"--config {path}: which method's pass? The recipe is not in a method's folder "
                         "(configs/<method>/) and sets neither num_presamples (DPH-RL) nor num_value_samples (A*-PO): "
                         "pass --num_samples and the sampling options yourself, or keep the copy in a folder named "
                         "dph/ or apo/")
    return found[0]


def recipe_for_presample(recipe: dict, method: str) -> tuple[dict, list[str]]:
    """``(options, ignored keys)``: a training recipe as the ``trl-variants presample`` options that make the
    dataset its trainer's offline pass would make (and that the trainer then uses as it is): DPH-RL's k samples per
    prompt with their log-probs (``num_presamples``), A*-PO's N samples and V_hat (``num_value_samples``,
    ``value_beta``, ``presample_shard_size``), with the recipe's model, data, prompt and reward, and the trainer's
    sampling options and seed (the method's defaults where the recipe sets none, as the trainer samples).
    Training-only keys are ignored (returned); a key neither command knows is kept, so the parser refuses it."""
    from dataclasses import MISSING, fields

    from ..registry import method_classes

    config_cls = method_classes(method)[1]
    if method == "composed" and "dph_rehearsal" in (recipe.get("parts") or []):
        method = "dph"  # DPH-RL's part runs the pass, with the composed config's fields of the same names
    if method not in ("dph", "apo"):
        why = {"eepo": "EEPO has no offline pass", "grpo": "GRPO has no offline pass",
               "composed": "of its parts only dph_rehearsal has a sampling pass, and its parts do not list it",
               "erpo": "ERPO's pass only scores each prompt (l_ref(s)), which its trainer does before training in one "
                       "forward per batch"}.get(method, "it has no sampling pass")
        raise ValueError(f"--config: the {method} recipe has nothing to presample: {why}. Presampling is for the "
                         "recipes of DPH-RL, A*-PO and a composed trainer with dph_rehearsal")
    defaults = {f.name: f.default for f in fields(config_cls) if f.default is not MISSING}

    def value(key):
        return recipe.get(key, defaults.get(key))

    options = {"record_prompt_logp": False, "generation_batch_size": value("presample_generation_batch_size"),
               **{key: value(key) for key in _SAMPLING}}
    options["top_k"], options["min_p"] = options["top_k"] or 0, options["min_p"] or 0.0  # TRL's None: off
    if method == "dph":
        options.update(num_samples=value("num_presamples"), record_completion_logps=True)
    else:
        options.update(num_samples=value("num_value_samples"), value_beta=value("value_beta"),
                       shard_size=value("presample_shard_size"))
    if recipe.get("presample_cache_dir"):
        options["cache_dir"] = recipe["presample_cache_dir"]
    known, training, ignored = _presample_keys(), training_keys(), []
    for key, val in recipe.items():
        if key in _CONSUMED:
            continue
        if key in _TRAINING_MEANING or (key not in known and key in training):
            ignored.append(key)
        elif key not in options:  # the sampling options are taken above
            options[key] = val
    return {k: v for k, v in options.items() if v is not None}, ignored


def parse_presample_args(argv: list[str]):
    """``(script_args, config)`` of ``trl-variants presample``; ``--config`` may name a DPH-RL or A*-PO training
    recipe (:func:`recipe_for_presample`; it prints what it ignored). Flags override it."""
    import os

    from ..presample import PresampleConfig
    from ..recipe_catalog import recipe_name
    from ..registry import method_classes

    parser = Parser((PresampleScriptArguments, PresampleConfig), prog="trl-variants presample",
                    description=COMMAND_HELP["presample"], epilog=CONFIG_HELP)

    def to_options(recipe, path, value, rest):
        if not any(key in recipe for key in training_keys() - _presample_keys()):
            return recipe  # a YAML of presample's own options
        method = recipe_method(recipe, path)
        options, ignored = recipe_for_presample(recipe, method)
        if os.environ.get("RANK", "0") == "0":
            shipped = f" (the shipped recipe {recipe_name(path)})" if str(path) != value else ""
            print(f"--config {value}{shipped}: a training recipe of {method_classes(method)[0]._name}; presampling "
                  f"what its trainer's offline pass would ({options['num_samples']} samples per prompt, its model, "
                  f"data, prompt, reward, sampling and seed), its training-only keys ignored: {', '.join(ignored)}. "
                  f"Train on the result with --config {value} --dataset_name <output_dir>", flush=True)
        return options

    return parse_with_recipe(parser, argv, "presample", to_options)


def _presample_keys() -> set[str]:
    from dataclasses import fields

    from ..presample import PresampleConfig

    return {f.name for cls in (PresampleScriptArguments, PresampleConfig) for f in fields(cls)}


def end_processes(state) -> None:
    """Several processes: wait for all of them, then destroy the process group, as ``trl-variants train`` does
    (``Accelerator.end_training``). Gloo's worker threads otherwise can outlive the interpreter and abort the process at
    exit (SIGABRT, "terminate called without an active exception") after the work is done."""
    if state.num_processes > 1:
        state.wait_for_everyone()
        state.destroy_process_group()


def presample_main(argv: list[str]) -> None:
    from accelerate import PartialState

    from ..default import DEFAULT_MODEL_PATH
    from ..presample import presample

    script_args, config = parse_presample_args(argv)
    if script_args.push_to_hub:  # the push comes after the pass, which may take hours: its needs are checked now
        from ..recipe_catalog import hub_push_problems

        if not script_args.hub_dataset_id:
            raise ValueError("--push_to_hub needs --hub_dataset_id org/name")
        problems = hub_push_problems(script_args.hub_dataset_id, "hub_dataset_id")
        if problems:
            raise ValueError("the presampled dataset could not be pushed (checked before the pass):\n"
                             + "\n".join(f"  - {p}" for p in problems))
    check_model_reference(script_args.model_name_or_path, "--model_name_or_path")  # before the data and model load
    if config.backend == "vllm":
        from ..presample.vllm_backend import check_vllm_setup

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

        from ..presample import dataset_card

        model_id = public_name(script_args.model_name_or_path) or "tiny"  # a local path by its last part
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
        source = {"dataset": public_name(script_args.dataset_name), "config": script_args.dataset_config,
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

    from ..presample.card import CARD_MARKER

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


def prompt_length_tokenizer(script_args, model: str):
    """The tokenizer ``--filter_prompt_length`` counts prompt tokens with (``model``'s), or None without the flag."""
    if script_args.filter_prompt_length is None:
        return None
    from transformers import AutoTokenizer

    from ..training.model_options import model_path

    return AutoTokenizer.from_pretrained(model_path(model))

