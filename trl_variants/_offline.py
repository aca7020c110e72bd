"""The offline pass as a trainer runs it: the prompt ids it generates from (chat template, tools, environments),
its sampling options and reward functions in the pass's terms, the checks of a presampled dataset against the
trainer, and the pass's numbers, logged once the trackers run. The pass itself is :mod:`trl_variants.presample`."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from ._model import full_parameters, on_accelerator_device, params_sharded
from .presample import check_presample_options, presample
from .presample.random_state import preserved_random_state
from .presample.stored import check_stored_columns
from .presample.vllm_backend import trainer_generator


def trainer_prompt_ids(trainer, rows) -> list[list[int]]:
    """The prompt token ids ``trainer`` generates from for each of ``rows``: its own tokenization (chat template,
    ``chat_template_kwargs``, tools), so an offline pass that uses it stores exactly the ids the trainer will see.

    ``rows``: the dataset's rows (dicts), or only their prompts. With ``environment_factory`` the prompt is the row's
    prompt with the observation its environment's ``reset(**row)`` returns, rendered with that environment's tools
    (:func:`environment_prompts`), so the rows are needed."""
    rows = list(rows)
    if getattr(trainer, "environment_factories", None) is None:
        prompts = [row["prompt"] if isinstance(row, dict) else row for row in rows]
        return [list(ids) for ids in trainer._tokenize_prompts(prompts)[0]]
    if rows and not isinstance(rows[0], dict):
        raise TypeError(f"{type(trainer).__name__}: with environment_factory the prompt ids need the dataset's rows "
                        "(reset(**row) makes each prompt's observation), not only their prompts")
    # at most one generation batch of a process at a time: the environment pool grows no larger than training's
    size = max(1, trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation)
    ids: list[list[int]] = []
    for start in range(0, len(rows), size):
        ids += _environment_prompt_ids(trainer, rows[start : start + size])
    return ids


class _PromptsBuilt(Exception):
    """Raised by the stand-in for ``GRPOTrainer._generate`` in :func:`environment_prompts`, with the prompts."""


def environment_prompts(trainer, rows) -> list:
    """The prompts GRPOTrainer generates from for ``rows`` under ``environment_factory``, built by GRPOTrainer's own
    batch setup (``_generate_and_score_completions``: each row's environment drawn from the trainer's pool, reset
    with the row, its observation joined to the prompt's last message), stopped where it would generate: ``_generate``
    is shadowed, for this call only, by a function that hands back its prompts. Leaves ``_batch_environments`` (the
    environment of each row, which ``_tokenize_prompts`` renders the tools of) set for these rows."""
    from trl import GRPOTrainer

    def built(prompts):
        raise _PromptsBuilt(prompts)

    environments = trainer.environments
    trainer._generate = built
    try:
        GRPOTrainer._generate_and_score_completions(trainer, [dict(row) for row in rows])
    except _PromptsBuilt as done:
        return done.args[0]
    finally:
        del trainer._generate
        trainer.environments = environments  # the rollouts' instances are drawn again for each training batch
    raise RuntimeError("GRPOTrainer._generate_and_score_completions returned without calling _generate: this TRL "
                       "version builds its prompts elsewhere, and the offline pass cannot know them")


def _environment_prompt_ids(trainer, rows) -> list[list[int]]:
    """The ids of :func:`environment_prompts`, each rendered with its environment's tools. Built twice: the offline
    pass knows each prompt before training only if ``reset(**row)`` gives the same one for the same row."""
    first = environment_prompts(trainer, rows)
    again = environment_prompts(trainer, rows)
    for a, b in zip(first, again, strict=True):
        if a != b:
            raise ValueError(
                f"{type(trainer).__name__}: with environment_factory, reset() made a different prompt for the same "
                f"row ({a[-1]['content']!r}, then {b[-1]['content']!r}): the environment makes its tasks during "
                "training, and this trainer's offline pass needs every prompt before training (ERPO's reference "
                "log-likelihoods, DPH-RL's and A*-PO's reference samples). Give each task as a train_dataset row "
                "(reset(**row) returning the same observation for the same row), or train with GRPOTrainer")
    return [list(ids) for ids in trainer._tokenize_prompts(again)[0]]


def offline_rows(trainer, dataset):
    """What :func:`trainer_prompt_ids` needs of ``dataset``: its rows under ``environment_factory`` (reset reads
    them), else only its prompts."""
    if getattr(trainer, "environment_factories", None) is None:
        return dataset["prompt"]
    return list(dataset)


def check_prompt_ids(trainer, dataset, column: str = "ref_prompt_ids") -> None:
    """Refuse a presampled dataset whose stored prompt ids are not the ones ``trainer`` trains on (another chat
    template, ``chat_template_kwargs`` or tools): its reference quantities would score other prompts."""
    if column not in dataset.column_names:
        return
    mine = trainer_prompt_ids(trainer, offline_rows(trainer, dataset))
    bad = [i for i, (stored, ids) in enumerate(zip(dataset[column], mine, strict=True)) if list(stored) != ids]
    if bad:
        raise ValueError(
            f"the presampled dataset's {column!r} differ from the trainer's own tokenization of the same prompts at "
            f"rows {bad[:5]} ({len(bad)} of {len(dataset)}): it was made with another chat template, "
            "chat_template_kwargs or tools. Presample again with the trainer's settings, or pass the raw prompts and "
            "let the trainer run the pass")


def refuse_offline_sampling(who: str, *, tools, environments: bool) -> None:
    """Refuse what a pass that samples the reference before training (DPH-RL's split, A*-PO's stage 1) cannot draw as
    GRPO draws its rollouts: with tools, GRPO's rollouts are multi-turn (a call, the tool's result, the next turn);
    with ``environment_factory``, every rollout also resets an environment whose state the reward functions read.
    Such a pass samples one turn from the dataset's prompt, so its samples and rewards would describe other rollouts.
    ``tools``: the tool functions (names shown), ``environments``: whether an ``environment_factory`` is given."""
    if environments:
        raise ValueError(
            f"{who} cannot use environment_factory: the offline pass cannot run the environments (it samples each "
            "reference completion in one turn from the dataset's prompt: no reset() per rollout, no tool calls, no "
            "`environments` for the reward functions), so its samples and rewards would not be the rollouts GRPO "
            "trains on. Train with GRPOTrainer or ERPOTrainer")
    if tools:
        names = [getattr(t, "__name__", type(t).__name__) for t in tools]
        raise ValueError(
            f"{who} cannot use tools {names}: the offline pass samples one turn and cannot run tool calls, while "
            "GRPO's rollouts with tools are multi-turn (the call, the tool's result, the next turn), so the "
            "reference samples and their rewards would not be the rollouts it trains on. Train without tools, or "
            "with GRPOTrainer or ERPOTrainer")


def sampling_options(trainer) -> dict:
    """The trainer's options that define its sampling distribution, in :class:`PresampleConfig`'s names: a pass
    that samples the reference must use exactly these, and a presampled dataset must have been made with them.
    Refused when no such pass can draw the trainer's rollouts (tools, environments: :func:`refuse_offline_sampling`)."""
    refuse_offline_sampling(type(trainer).__name__, tools=trainer.tools,
                            environments=getattr(trainer, "environment_factories", None) is not None)
    return dict(temperature=trainer.temperature, top_p=trainer.top_p, top_k=trainer.top_k or 0,
                min_p=trainer.min_p or 0.0, repetition_penalty=trainer.repetition_penalty,
                max_completion_length=trainer.max_completion_length,
                generation_kwargs=trainer.args.generation_kwargs or None)


def callable_reward_funcs(trainer, who: str) -> list:
    """``trainer``'s reward functions as its offline pass calls them: each reward model wrapped with its tokenizer
    (scored as GRPOTrainer scores it). Refused when a reward model is sharded (ZeRO-3, FSDP): every process runs its
    own shards of the pass, so the processes would not run the model's collective forward calls together."""
    from .presample.reward_calls import wrap_reward_models

    has_model = any(isinstance(f, torch.nn.Module) for f in trainer.reward_funcs)
    if has_model and params_sharded(trainer):
        raise ValueError(f"{who}: the offline pass cannot score with a reward model sharded by ZeRO-3 / FSDP. Run it "
                         "first with `trl-variants presample --reward_model_name_or_path ...` (each process loads "
                         "the whole reward model) and train on its output, or use ZeRO-2 / DDP")
    return wrap_reward_models(trainer.reward_funcs, trainer.reward_processing_classes, trainer.chat_template_kwargs)


def check_presampled_model(trainer, dataset) -> None:
    """Refuse a presampled dataset that another model made (``presample.metadata.check_presample_model``), with the
    trainer's own weights gathered one at a time under ZeRO-3."""
    from .presample.metadata import check_presample_model

    check_presample_model(dataset, trainer.model, type(trainer).__name__,
                          gather=lambda p: full_parameters(trainer, [p]))


def stored_or_computed(trainer, dataset, columns, compute, *, check=None, **options):
    """Reuse the stored columns or run the offline pass, the one way every part and trainer does it: ``dataset`` as
    it is when it has every one of ``columns`` (presampled by `trl-variants presample`, or the user's own columns),
    once :func:`~trl_variants.presample.stored.check_stored_columns` and ``check(dataset)`` accept their values, the
    pass recorded the ``options`` the trainer samples with (:func:`~trl_variants.presample.check_presample_options`),
    this model made it (:func:`check_presampled_model`) and its prompt ids are the trainer's own
    (:func:`check_prompt_ids`); else ``compute(dataset)``, the pass run now (:func:`trainer_presample`, or a method's
    own)."""
    if not all(c in dataset.column_names for c in columns):
        return compute(dataset)
    # values the pass cannot have made are refused here too: an eval dataset is checked nowhere else
    check_stored_columns(dataset, type(trainer).__name__, None, columns)
    if check is not None:
        check(dataset)
    check_presample_options(dataset, **options)
    check_presampled_model(trainer, dataset)  # made by this model (its weights, in any dtype)
    check_prompt_ids(trainer, dataset)
    return dataset


def trainer_presample(trainer, dataset, config, *, model=None, tokenize_fn=None, generator=True, shards=None):
    """:func:`~trl_variants.presample.presample` as ``trainer`` runs it: on ``model`` (default: the trainer's own,
    scored with the trainer's fused log-prob kernel), in eval mode and with its full weights (ZeRO-3 / FSDP
    gathered), with the trainer's reward functions (:func:`callable_reward_funcs`) and weights, its prompt ids
    (:func:`trainer_prompt_ids`; ``tokenize_fn`` replaces them), its generator
    (:func:`~trl_variants.presample.vllm_backend.trainer_generator`; ``generator=False``: the pass's own) and its
    ``state`` for the reward functions. ``config``: the :class:`~trl_variants.presample.PresampleConfig`;
    ``shards``: only these shards of the pass."""
    reward_funcs = callable_reward_funcs(trainer, type(trainer).__name__)  # reward models scored as GRPO does
    model = trainer.model if model is None else model
    scorer = None
    if model is trainer.model:
        def scorer(ids, mask):  # stored and online log-probs from one kernel
            device = trainer.accelerator.device
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids.to(device), mask.to(device),
                                                                     ids.size(1) - 1)
            return logps

    was_training = model.training
    model.eval()
    try:
        with full_parameters(trainer), on_accelerator_device(trainer, model):
            return presample(model, trainer.processing_class, dataset, reward_funcs, config,
                             reward_weights=trainer.reward_weights.tolist(), accelerator=trainer.accelerator,
                             token_logps_fn=scorer,
                             tokenize_fn=tokenize_fn or (lambda prompts: trainer_prompt_ids(trainer, prompts)),
                             generator=trainer_generator(trainer) if generator else None,
                             trainer_state=trainer.state, shards=shards)
    finally:
        model.train(was_training)


class OfflinePassLogMixin:
    """The offline pass's numbers, logged once the trackers run. Mix in before ``GRPOTrainer``.

    The offline pass runs in ``__init__``; transformers starts the trackers (wandb, trackio, ...) only in
    ``on_train_begin`` or at the first log. TRL's profiling reports every profiled call (the pass's scoring forwards
    among them) straight to the trackers in ``report_to``, and ``trackio.log`` before ``trackio.init`` raises ("Call
    trackio.init() before trackio.log()"). So inside :meth:`offline_pass` nothing reports (``args.report_to`` is
    emptied, then restored); the pass's wall time and the numbers given to :meth:`defer_log` are added, under
    ``offline_pass/``, to the trainer's first log (training or evaluation), which reaches every tracker. The pass
    leaves the random state as it found it (:func:`preserved_random_state`)."""

    _offline_logs: dict | None = None

    @contextmanager
    def offline_pass(self):
        report_to, self.args.report_to = self.args.report_to, []
        start = time.perf_counter()
        try:
            with preserved_random_state():
                yield
        finally:
            self.args.report_to = report_to
        self.defer_log({"seconds": time.perf_counter() - start})

    def defer_log(self, numbers: dict) -> None:
        self._offline_logs = {**(self._offline_logs or {}),
                              **{f"offline_pass/{k}": float(v) for k, v in numbers.items()}}

    def log(self, logs, start_time=None):
        # into the first training log, in place, after the caller's keys. Not into an eval log (an ``evaluate()``
        # before ``train()``): ``evaluate`` returns the dict it logs, whose keys are its own; GRPOTrainer tells an
        # eval log by its first key ("eval_...") and adds its eval metrics to that same dict
        if self._offline_logs and not next(iter(logs), "").startswith("eval_"):
            logs.update(self._offline_logs)
            self._offline_logs = None
        return super().log(logs, start_time)
