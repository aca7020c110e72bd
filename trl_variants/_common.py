"""Small helpers shared by the four trainers: config resolution, the offline pass as a trainer runs it, full parameters
under ZeRO-3, and the stop on a non-finite loss."""

from __future__ import annotations

import torch


def resolve_config(model, args, config_cls, suffix: str):
    """``args`` checked to be a ``config_cls``; when None, a default one named ``<model name>-<suffix>`` (as TRL does
    for GRPOTrainer)."""
    if args is None:
        name = model if isinstance(model, str) else model.config._name_or_path
        return config_cls(f"{str(name).rstrip('/').split('/')[-1]}-{suffix}")
    if not isinstance(args, config_cls):
        raise TypeError(f"args must be a {config_cls.__name__}, got {type(args).__name__}: build one with "
                        f"{config_cls.__name__}(...)")
    return args


# --------------------------------------------------------------------------- the offline pass, as a trainer runs it ---
def trainer_prompt_ids(trainer, prompts) -> list[list[int]]:
    """The prompt token ids ``trainer`` trains on: its own tokenization (chat template, ``chat_template_kwargs``,
    tools), so an offline pass that uses it stores exactly the ids the trainer will see."""
    return [list(ids) for ids in trainer._tokenize_prompts(list(prompts))[0]]


def check_prompt_ids(trainer, dataset, column: str = "ref_prompt_ids") -> None:
    """Refuse a presampled dataset whose stored prompt ids are not the ones ``trainer`` trains on (another chat
    template, ``chat_template_kwargs`` or tools): its reference quantities would score other prompts."""
    if column not in dataset.column_names:
        return
    mine = trainer_prompt_ids(trainer, dataset["prompt"])
    bad = [i for i, (stored, ids) in enumerate(zip(dataset[column], mine, strict=True)) if list(stored) != ids]
    if bad:
        raise ValueError(
            f"the presampled dataset's {column!r} differ from the trainer's own tokenization of the same prompts at "
            f"rows {bad[:5]} ({len(bad)} of {len(dataset)}): it was made with another chat template, "
            "chat_template_kwargs or tools. Presample again with the trainer's settings, or pass the raw prompts and "
            "let the trainer run the pass")


def sampling_options(trainer) -> dict:
    """The trainer's options that define its sampling distribution, in :class:`PresampleConfig`'s names: a pass
    that samples the reference must use exactly these, and a presampled dataset must have been made with them."""
    return dict(temperature=trainer.temperature, top_p=trainer.top_p, top_k=trainer.top_k or 0,
                min_p=trainer.min_p or 0.0, repetition_penalty=trainer.repetition_penalty,
                max_completion_length=trainer.max_completion_length,
                generation_kwargs=trainer.args.generation_kwargs or None)


def full_parameters(trainer):
    """Context in which ``trainer.model`` holds its full parameters on every process: under DeepSpeed ZeRO-3 they are
    partitioned from the moment the model is loaded, so the offline passes (run in ``__init__``, before the model is
    prepared) gather them with DeepSpeed's ``zero.GatheredParameters`` (read-only: no process writes them back).
    Every other setup already holds full parameters at that point; FSDP shards them only in ``prepare``."""
    from contextlib import nullcontext

    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if not trainer.is_deepspeed_enabled or plugin is None or plugin.zero_stage != 3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(trainer.model.parameters()), modifier_rank=None)


class FiniteLossMixin:
    """Stop training at the first non-finite loss, before the optimizer applies its gradients. transformers logs such a
    loss as 0 (``logging_nan_inf_filter``) while the update turns every weight into NaN; here every process learns of
    it (one flag summed over processes), so all stop at the same micro-step."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        bad = (~torch.isfinite(loss.detach())).float().reshape(1)
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad, "sum")
        if bad.item() > 0:
            raise FloatingPointError(
                f"{type(self).__name__}: the loss is {loss.item()} at optimizer step {self.state.global_step + 1} "
                f"(on {int(bad.item())} process(es)); training stops before the update would make the weights "
                "non-finite. Look at the last logged rewards and advantages, lower learning_rate, or resume from the "
                "last checkpoint")
        return loss
