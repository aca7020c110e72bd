"""The training entry point: ``trl-variants train <method>`` and ``examples/train_<method>.py``
(:func:`train_main`) run :func:`run_training`: keep a recipe's batch, parse, check, load the data and rewards,
build the trainer, train, save, push."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trl import ModelConfig

from .._card import command_text
from .._config_checks import launch_processes
from .._model import full_state_dict_for_final_save
from .._preemption import EXIT_CODE as SIGTERM_EXIT_CODE
from .._preemption import stopped_line
from .._validation import check_model_reference
from ..cli.errors import UsageError, training_started
from ..data import check_dataset_flags, get_reward_funcs, load_datasets, uses_embedded
from ..recipe_catalog import default_recipe, recipe_name, resolve_recipe
from ..registry import method_classes
from .arguments import TrainScriptArguments, check_heldout_flags, config_argument, heldout_origin, parse_args
from .batch import recipe_batch
from .model_options import check_model_flags, model_init_kwargs, model_name_or_path, quantization_config
from .preflight import check_prerequisites, where_it_runs


def trainer_kwargs(script_args: TrainScriptArguments, training_args, model_args: ModelConfig) -> dict:
    """The keyword arguments of the trainer, built as TRL's grpo.py builds GRPOTrainer's (reward model path first
    in ``reward_funcs``, ``quantization_config`` and ``peft_config`` from TRL's helpers). Every flag is checked
    before anything loads, and what the run needs (:func:`check_prerequisites`: extras, tracker login, Hub id and
    token, the checkpoint to resume); the datasets load here, the models in the trainer."""
    from trl import get_peft_config

    check_prerequisites(training_args)
    check_model_flags(model_args)
    check_dataset_flags(script_args)
    quantization = quantization_config(model_args)
    check_model_reference(model_name_or_path(model_args), "--model_name_or_path")
    reward_funcs = []
    if script_args.reward_model_name_or_path:  # a path: GRPOTrainer loads it (num_labels=1) and its tokenizer
        check_model_reference(script_args.reward_model_name_or_path, "--reward_model_name_or_path")
        reward_funcs.append(script_args.reward_model_name_or_path)
    reward_funcs += get_reward_funcs(script_args.reward_funcs, allow_empty=bool(reward_funcs))
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    tokenizer = None
    if script_args.filter_prompt_length is not None:  # the tokenizer GRPOTrainer will load for the model
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path(model_args), revision=model_args.model_revision,
                                                  trust_remote_code=training_args.trust_remote_code)
    train_dataset, eval_dataset = load_datasets(script_args, training_args, tokenizer)
    return dict(model=model_name_or_path(model_args), reward_funcs=reward_funcs, args=training_args,
                train_dataset=train_dataset, eval_dataset=eval_dataset, quantization_config=quantization,
                peft_config=get_peft_config(model_args))


def run_training(trainer_cls, config_cls, default_config: str | Path | None = None, argv: list[str] | None = None,
                 prog: str | None = None):
    """What every ``examples/train_<algorithm>.py`` does, top to bottom: keep a recipe's batch on this process count
    (:func:`recipe_batch`), parse (YAML + flags), check every flag and what the run needs (:func:`trainer_kwargs`,
    :func:`check_prerequisites`), load the data and rewards, build the trainer, train, save, push."""
    from .._checkpoint import resume_target

    argv = list(sys.argv[1:] if argv is None else argv)
    config = config_argument(argv, default_config)
    processes, flags = launch_processes(), []
    if config is not None and os.path.isfile(config):
        flags, note = recipe_batch(config, argv, processes, config_cls)
        if note and os.environ.get("RANK", "0") == "0":
            print(note)
    script_args, training_args, model_args = parse_args(config_cls, default_config=default_config,
                                                        argv=argv + flags, prog=prog)
    if flags and training_args.world_size != processes:
        raise ValueError(f"the batch was rescaled for {processes} processes (read from the launcher's environment), "
                         f"but this run has {training_args.world_size}: pass the batch flags yourself, or "
                         "--keep_recipe_batch false")
    check_heldout_flags(script_args, heldout_origin(argv, default_config))
    if os.environ.get("RANK", "0") == "0":
        print(where_it_runs(training_args))
    training_args.resume_from_checkpoint = resume_target(training_args.resume_from_checkpoint)
    trainer = trainer_cls(**trainer_kwargs(script_args, training_args, model_args))
    trainer.training_command = command_text(prog, argv)  # the model card shows it (_card.ModelCardMixin)
    if script_args.heldout_eval_steps:
        from ..data.loading import load_default_dataset  # looked up now: tests replace it
        from ..evaluation import HeldOutCallback

        heldout = load_default_dataset(0, script_args.embedded_test_size)["test"]
        trainer.add_callback(HeldOutCallback(trainer, heldout, k=script_args.heldout_k,
                                             eval_steps=script_args.heldout_eval_steps))
    train_and_save(trainer, training_args, script_args)
    return trainer


def train_and_save(trainer, training_args, script_args):
    """Train (resuming when asked), save the final model and card, push to the Hub when asked."""


    training_started()  # from here an error is a crash, with its traceback (the checkpoint was checked at construction)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if getattr(trainer, "stopped_by_signal", None) is not None:  # preempted: the checkpoint is the run; no final save, card or push
        if trainer.accelerator.is_main_process:
            print(stopped_line(trainer), flush=True)
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
        raise SystemExit(SIGTERM_EXIT_CODE)
    before = weight_files(training_args.output_dir) if trainer.accelerator.is_main_process else None
    with full_state_dict_for_final_save(trainer):  # the whole model under FSDP; no push yet (transformers' public
        # save_model pushes when push_to_hub is set, before the check and the card): the push is below
        trainer.save_model(training_args.output_dir, _internal_call=True)
    check_saved_weights(trainer, training_args.output_dir, before)  # before the card and the push
    # the Hub link of the card: none for the embedded task or a mixture
    dataset_name = None if uses_embedded(script_args) or script_args.datasets else script_args.dataset_name
    hub_id = training_args.hub_model_id
    model_name = hub_id.split("/")[-1] if hub_id else Path(training_args.output_dir).name
    trainer.create_model_card(model_name=model_name, dataset_name=dataset_name)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name, model_name=model_name)
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:  # the process that saved, after it did (on several nodes,
        # accelerator.print would also print on each node's first process, before the main one had saved)
        print(f"model saved to {training_args.output_dir} (trained on {trainer.accelerator.num_processes} process(es))")
    trainer.accelerator.end_training()  # finishes trackers and destroys the process group (Gloo aborts at exit otherwise)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "adapter_model.bin")


def weight_files(output_dir: str) -> dict:
    """The weight files in ``output_dir`` (:data:`WEIGHT_FILES`), each with what a save that writes it changes (its
    modification time, size and inode)."""
    found = {}
    for name in WEIGHT_FILES:
        path = os.path.join(output_dir, name)
        if os.path.exists(path):
            st = os.stat(path)
            found[name] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return found


def check_saved_weights(trainer, output_dir: str, before: dict | None = None) -> None:
    """The final save wrote the weights (a model's or a PEFT adapter's) to ``output_dir``, else an error on every
    process, before the model card and the Hub push. transformers skips them without an error under DeepSpeed ZeRO-3
    with ``stage3_gather_16bit_weights_on_model_save`` off (a warning, and a DeepSpeed checkpoint instead). With
    ``before`` (:func:`weight_files` before the save), weights an earlier run left in a reused ``output_dir`` and the
    save did not touch count as none. The main process looks (the one that saved; another node may not see its disk)
    and tells the others."""
    problem = None
    if trainer.accelerator.is_main_process:
        after = weight_files(output_dir)
        stale = bool(after) and before is not None and all(before.get(name) == seen for name, seen in after.items())
        if not after or stale:
            found = (f"only {', '.join(after)} from an earlier run, which this save left as it was" if stale
                     else f"none of {', '.join(WEIGHT_FILES[:3])}")
            problem = (f"the final save wrote no model weights to {output_dir} ({found}). "
                       "Under DeepSpeed ZeRO-3, set `zero3_save_16bit_model: true` in the accelerate config's "
                       "deepspeed_config (`stage3_gather_16bit_weights_on_model_save: true` in a DeepSpeed JSON; "
                       "configs/accelerate/zero3.yaml does), or recover them from the DeepSpeed checkpoint there with "
                       "DeepSpeed's zero_to_fp32.py. The checkpoints in it resume the run")
    if trainer.accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        problem = broadcast_object_list([problem], from_process=0)[0]
    if problem:
        raise RuntimeError(problem)


def _with_resolved_config(argv: list[str], method: str) -> list[str]:
    """``argv`` with ``--config NAME`` (or ``--config=NAME``) replaced by the recipe's path."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[i:i + 1] = ["--config", arg.split("=", 1)[1]]
            break
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config needs a value: a YAML path or a shipped recipe's name "
                             "(`trl-variants train --list`)")
        try:
            path = resolve_recipe(argv[i + 1], method)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"--config {e}") from None
        if str(path) != argv[i + 1] and os.environ.get("RANK", "0") == "0":
            print(f"--config {argv[i + 1]}: the shipped recipe {recipe_name(path)} ({path})")
        argv[i + 1] = str(path)
    return argv


def train_main(method: str, trainer_cls=None, config_cls=None, argv: list[str] | None = None,
               prog: str | None = None):
    """``trl-variants train <method> [--config NAME_OR_PATH] [flags]`` and ``examples/train_<method>.py``: train with
    :func:`run_training`; without ``--config`` on the method's default recipe (:func:`default_recipe`), with
    ``--config`` on a YAML file or a shipped recipe (:func:`resolve_recipe`, bare names looked up in ``method``'s
    folder first). ``trainer_cls`` / ``config_cls``: the method's own
    (:data:`~trl_variants.recipe_catalog.METHODS`) unless given, e.g. your subclass of them."""
    if trainer_cls is None or config_cls is None:
        own_trainer, own_config = method_classes(method)
        trainer_cls, config_cls = trainer_cls or own_trainer, config_cls or own_config
    argv = _with_resolved_config(sys.argv[1:] if argv is None else argv, method)
    return run_training(trainer_cls, config_cls, default_recipe(method), argv=argv, prog=prog)
