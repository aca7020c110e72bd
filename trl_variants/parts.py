"""Parts: each method's additions to GRPO as a small contract over ``GRPOTrainer``'s hooks, and one trainer that runs a
list of them (:class:`PartsTrainer`). A method's trainer is ``PartsTrainer`` with that method's parts (see
``erpo/part.py``); docs/parts.md shows how to combine parts.

The contract (every method is optional; a part touches only what it declares):

============================  ==============================================================================
``check(trainer_name, args,   before GRPOTrainer loads anything: refuse inputs the part cannot use (``kwargs``:
train_dataset, kwargs)``      the trainer's other keyword arguments and its ``reward_funcs``)
``needs``                     reference quantities the part reads, ``{name: provide(trainer, dataset, split)}``
                              (e.g. ERPO's ``ref_prompt_logp``): computed once per dataset, however many parts
                              ask for it (:meth:`PartsTrainer._provide`)
``setup(trainer)``            once, after ``GRPOTrainer.__init__`` (inside the trainer's offline pass when any
                              part sets ``offline_pass`` or has ``needs``): prepare datasets, the part's state
``eval_columns(trainer, d)``  the same for an evaluation dataset
``owns_rollout`` /            the part replaces GRPO's sampling of a batch (``_generate_single_turn``); at most
``generate(...)``             one part may
``after_rollout(trainer,      after GRPO has generated and scored one round of samples: fix what the rollout
inputs, output)``             knows about its own rows (EEPO: old log-probs under the weights that sampled them)
``fills_batch`` /             the part decides which scored groups make the batch and samples more rounds
``fill(trainer, inputs,       (DAPO's dynamic sampling); at most one part may; training only
rollout)``
``after_scoring(trainer,      on the batch that will be trained (after ``fill``): change the advantages, add
inputs, output)``             per-row tensors the loss reads
``wants_prompt_logps``        the part reads the prompt's log-likelihood off GRPO's own policy forward
``around_grpo_loss(trainer)`` a context around GRPO's own loss computation (e.g. a setting that must differ there)
``loss(trainer, model,        after GRPO's loss: the part's NAMED loss terms, ``{name: tensor or LossTerm}``, each
inputs, forward)``            as the part's formula writes it (coefficient included, this process's share of its
                              mean over the global batch), not scaled for gradient accumulation and not added to
                              anything: the trainer combines them (:meth:`PartsTrainer.combine_loss`); ``forward``
                              holds what GRPO's policy forward computed (:class:`PolicyForward`)
``forwards_own_batch``        the part's loss runs a forward with gradient of its own (a batch besides the
                              rollout's; DPH-RL's D_pef): refused under DeepSpeed ZeRO-3 with reentrant gradient
                              checkpointing, where that backward fails (a term on another batch is refused too)
``after_loss(trainer,         after the combination: each batch's loss (``"rollout"``: GRPO's plus the terms on
batch_losses)``               the rollout batch), for the part's own metrics
``state()`` /                 the part's checkpointed state (JSON; keys unique across parts)
``load_state(state)``
============================  ==============================================================================
Metrics go into ``trainer._metrics[mode]`` (``trainer.log_metric(name, value)`` for a part of one's own) under the
part's prefix (``erpo/...``); the trainer logs each loss term under ``loss/<name>``. A part that reads more than its own
rows uses the trainer's global helpers (:meth:`PartsTrainer.global_token_mean`, :meth:`PartsTrainer.global_mean`), so
that it trains the same on N processes as on one.

A part's class is registered by its ``name`` (:func:`register_part`, the built-in parts included), so that a
:class:`~trl_variants.ComposedConfig` can name it; :meth:`Part.from_config` builds it from a config.

The loss does not depend on the order of the parts: the terms are computed in the order of the parts' names and
added in the order of the terms' names, whatever the order of the list (``loss_combination``, below, is the
trainer's: ``"sum"`` or ``"count_weighted"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from types import MappingProxyType

import torch

from ._model import reentrant_checkpointing_under_zero3, second_forward_refusal
from ._part_attribute import PartAttribute  # noqa: F401  (trainers declare theirs from here)
from ._trainer import TrainerBase
from .generation import pack_prompt_completion


@dataclass
class PolicyForward:
    """What GRPO's policy forward in ``_compute_loss`` computed, for the parts' loss terms: the completion tokens'
    log-probs and, when a part asked for it, each row's prompt log-likelihood ``l_theta(s)`` (sum over the prompt
    tokens but the first), from the same forward."""

    want_prompt_logps: bool = False
    done: bool = False
    completion_logps: torch.Tensor | None = None
    prompt_logps: torch.Tensor | None = None


LOSS_COMBINATIONS = ("sum", "count_weighted")


@dataclass
class LossTerm:
    """One named term of a part's loss: ``value`` as the part's formula writes it (its coefficient included; this
    process's share of its mean over the global batch, so that the mean over processes, as DDP averages gradients,
    is that mean), not scaled for gradient accumulation. ``batch``: the rows it is a mean over, ``"rollout"`` (the
    rows GRPO trains, as GRPO's own loss) or another batch the part draws (DPH-RL's ``"dph_pef"``), with ``rows``
    its number of rows on this process (read by ``loss_combination="count_weighted"``)."""

    value: torch.Tensor
    batch: str = "rollout"
    rows: int | None = None


class Part:
    """One method's additions to GRPO (the contract is in this module's docstring; docs/parts.md walks through a new
    one). A subclass sets ``name`` (unique among the parts of a trainer; its metrics' prefix) and defines the hooks
    it needs. ``str(part)`` is its name (what a config's record and a checkpoint keep of it)."""

    name = "part"
    # name -> provide(trainer, dataset, split) -> dataset with that column; read-only, each class its own (a dict
    # given in a class body is frozen into a read-only copy; an instance may set its own)
    needs: Mapping = MappingProxyType({})
    offline_pass = False  # setup samples or scores the dataset before training (timed and logged as offline_pass/)
    forwards_own_batch = False  # its loss runs a forward with gradient of its own (see the table above)
    owns_rollout = False
    fills_batch = False
    wants_prompt_logps = False
    citation: str | None = None  # the BibTeX entry of the part's paper: model cards cite it, with its Hub tag
    tag: str | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("needs"), dict):  # no class shares (or mutates) another's needs
            cls.needs = MappingProxyType(dict(cls.__dict__["needs"]))

    @classmethod
    def from_config(cls, args) -> Part:
        """The part as a config sets it up (how :class:`~trl_variants.ComposedTrainer` builds a part it is given by
        name or class). Default: ``cls()``; a part with options reads them from ``args`` here or takes them in
        ``__init__`` (then give an instance)."""
        return cls()

    def __str__(self) -> str:
        return self.name

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        pass

    def setup(self, trainer) -> None:
        pass

    def eval_columns(self, trainer, dataset):
        return dataset

    def generate(self, trainer, grpo_generate, prompt_ids, images, multimodal_fields, num_generations,
                 has_tool_images=False):
        raise NotImplementedError

    def after_rollout(self, trainer, inputs, output) -> None:
        pass

    def fill(self, trainer, inputs, rollout):
        raise NotImplementedError

    def after_scoring(self, trainer, inputs, output) -> None:
        pass

    def around_grpo_loss(self, trainer):
        return nullcontext()

    def loss(self, trainer, model, inputs, forward: PolicyForward) -> dict:
        return {}

    def after_loss(self, trainer, batch_losses: dict) -> None:
        pass

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


# ------------------------------------------------------------------------------------------- the registry ---
_REGISTRY: dict[str, type[Part]] = {}
_BUILTIN = {"erpo_query_weights": "erpo.part", "erpo_query_kl": "erpo.part", "dph_rehearsal": "dph.part",
            "eepo_two_stage_rollout": "eepo.part", "dapo_dynamic_sampling": "dapo.part"}  # each registers on import


def register_part(cls: type[Part]) -> type[Part]:
    """Register a :class:`Part` subclass under its ``name`` (usable as a class decorator), so that a
    :class:`~trl_variants.ComposedConfig` can name it in ``parts``; built with :meth:`Part.from_config`. A name
    already registered to another class is refused (a class redefined under the same module and name replaces
    its earlier self)."""
    if not (isinstance(cls, type) and issubclass(cls, Part)):
        raise TypeError(f"register_part takes a subclass of trl_variants.Part, got {cls!r}")
    if cls.name == Part.name or not isinstance(cls.name, str) or not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name of its own: set the class attribute name = '...'")
    known = _REGISTRY.get(cls.name)
    builtin = _BUILTIN.get(cls.name)
    if builtin is not None and cls.__module__ != f"{__package__}.{builtin}":
        raise ValueError(f"{cls.name!r} is the name of a built-in part: give the new part another name")
    if known is not None and known is not cls and \
            (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"a part named {cls.name!r} is already registered ({known.__module__}.{known.__qualname__}): "
                         "give the new part another name")
    _REGISTRY[cls.name] = cls
    return cls


def part_class(name: str) -> type[Part]:
    """The :class:`Part` subclass registered under ``name`` (the built-in parts and those of
    :func:`register_part`)."""
    if name in _BUILTIN and name not in _REGISTRY:
        importlib.import_module(f"{__package__}.{_BUILTIN[name]}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown part {name!r}: choose one of {registered_parts()} (a part of your own: decorate "
                         "its class with trl_variants.register_part, or give an instance)")
    return _REGISTRY[name]


def registered_parts() -> list[str]:
    """The names :func:`part_class` knows: the built-in parts, then those of :func:`register_part`."""
    return [*_BUILTIN, *(name for name in _REGISTRY if name not in _BUILTIN)]


class PartsTrainer(TrainerBase):
    """``GRPOTrainer`` plus a list of :class:`Part`. Takes exactly GRPOTrainer's arguments. A subclass builds its
    parts from the config in :meth:`make_parts`; ``_config_class`` is the config class ``args`` must be an instance
    of (default :class:`~trl.GRPOConfig`: any GRPO-family config here), ``_config_suffix`` names the default
    output directory when ``args`` is None (:class:`~trl_variants._trainer.TrainerBase`)."""

    def make_parts(self, args) -> list[Part]:
        return []

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, **kwargs):
        name = type(self).__name__
        args = self._checked_args(model, args, train_dataset)
        self.parts = list(self.make_parts(args))
        for part in self.parts:
            if not isinstance(part, Part):
                raise TypeError(f"{name}.make_parts returned {part!r}, not a trl_variants.Part instance")
        for flag, what in (("owns_rollout", "replace GRPO's rollout"), ("fills_batch", "decide what fills the batch")):
            owners = [p.name for p in self.parts if getattr(p, flag)]
            if len(owners) > 1:
                raise ValueError(f"parts {owners[0]!r} and {owners[1]!r} each {what}: use one of them")
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: two parts are named {next(n for n in names if names.count(n) > 1)!r} (a part's "
                             "name keys its metrics and checkpoint state): give each part its own name")
        providers: dict = {}
        for part in self.parts:
            for need, provide in part.needs.items():
                if providers.setdefault(need, provide) is not provide:
                    raise ValueError(f"{name}: two parts need {need!r} from different functions: one name, one "
                                     "provider (share it, or name the quantity differently)")
        for part in self.parts:
            part.check(name, args, train_dataset, {**kwargs, "reward_funcs": reward_funcs})
        reward_funcs = self._checked_reward_funcs(model, reward_funcs, train_dataset, args)
        self._policy_forward: PolicyForward | None = None
        if getattr(args, "loss_combination", "sum") not in LOSS_COMBINATIONS:
            raise ValueError(f"loss_combination must be one of {LOSS_COMBINATIONS}, got {args.loss_combination!r}")
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         **kwargs)
        self._reentrant_zero3 = reentrant_checkpointing_under_zero3(self)  # TRL's __init__ settles use_reentrant
        if self._reentrant_zero3 and (own := [p.name for p in self.parts if p.forwards_own_batch]):
            raise ValueError(second_forward_refusal(name, f"part {own[0]!r}"))  # before any offline pass
        self._needs = {name: provide for part in self.parts for name, provide in part.needs.items()}
        offline = bool(self._needs) or any(p.offline_pass for p in self.parts)
        with self.offline_pass() if offline else nullcontext():  # its numbers reach the first log
            for part in self.parts:  # first: a part may replace the training set (DPH-RL: D_exp)
                part.setup(self)
            self._extra_state()  # now, not at the first save: two parts keeping one state key are refused
            self.train_dataset = self._provide(self.train_dataset, "train")  # then the needs, on what is trained
            self.prepare_eval_datasets()

    @property
    def loss_combination(self) -> str:
        """How :meth:`combine_loss` combines the loss of each batch: ``args.loss_combination`` where the config has
        the field (DPH-RL's and the composed trainer's), else ``"sum"``."""
        return getattr(self.args, "loss_combination", "sum")

    def part(self, name: str) -> Part:
        """This trainer's part named ``name``."""
        found = [p for p in self.parts if p.name == name]
        if not found:
            raise KeyError(f"{type(self).__name__} has no part named {name!r} (its parts: "
                           f"{[p.name for p in self.parts]})")
        return found[0]

    # ---------------------------------------------------------------------------- reference quantities (once) ---
    def _provide(self, dataset, split: str):
        """``dataset`` with the reference quantities the parts need, each computed once (``split``: "train" or
        "eval")."""
        for provide in self._needs.values():
            dataset = provide(self, dataset, split)
        return dataset

    def _with_eval_columns(self, dataset):
        dataset = self._provide(dataset, "eval") if dataset is not None else dataset
        for part in self.parts:
            dataset = part.eval_columns(self, dataset)
        return dataset

    # ------------------------------------------------------------------------------------------- the rollout ---
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        owner = next((p for p in self.parts if p.owns_rollout), None)
        grpo_generate = super()._generate_single_turn
        if owner is None:
            return grpo_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        return owner.generate(self, grpo_generate, prompt_ids, images, multimodal_fields, num_generations,
                              has_tool_images)

    def _generate_and_score_completions(self, inputs):
        if self.model.training:  # which training generation batch this is (the rounds of one fill share it)
            self.generation_batch_index = getattr(self, "generation_batch_index", -1) + 1
        filler = next((p for p in self.parts if p.fills_batch), None)
        if filler is not None and self.model.training:
            inputs, output = filler.fill(self, inputs, self._rollout)
        else:
            output = self._rollout(inputs)
        for part in self.parts:
            part.after_scoring(self, inputs, output)
        return output

    def _rollout(self, inputs):
        """One round: GRPO samples and scores ``inputs``, then the parts fix what the rollout knows of its rows."""
        output = super()._generate_and_score_completions(inputs)
        for part in self.parts:
            part.after_rollout(self, inputs, output)
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rollout_rewards = rewards  # every process's rows (GRPO gathers them): what dynamic sampling reads
        return rewards

    # ---------------------------------------------------------------------------------------------- the loss ---
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        forward = self._policy_forward
        if forward is None or forward.done:  # not GRPO's policy forward of this loss: as GRPO computes it
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              *args, **kwargs)
        forward.done = True
        if not forward.want_prompt_logps:
            out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                             *args, **kwargs)
            forward.completion_logps = out[0]
            return out
        # Score every position but the first in the same forward, then hand GRPO the completion slice only.
        prompt_len = input_ids.size(1) - logits_to_keep
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, input_ids.size(1) - 1, *args, **kwargs)
        valid = attention_mask[:, 1:prompt_len] * attention_mask[:, : prompt_len - 1]
        forward.prompt_logps = (logps[:, : prompt_len - 1] * valid).sum(-1)
        completion = slice(prompt_len - 1, None)
        forward.completion_logps = logps[:, completion]
        return forward.completion_logps, None if entropies is None else entropies[:, completion], aux

    def _compute_loss(self, model, inputs):
        if not self.parts:
            return super()._compute_loss(model, inputs)
        forward = PolicyForward(want_prompt_logps=any(p.wants_prompt_logps for p in self.parts))
        self._policy_forward = forward  # read by the first forward below (GRPO's policy forward), then done
        try:
            with ExitStack() as stack:
                for part in self.parts:
                    stack.enter_context(part.around_grpo_loss(self))
                loss = super()._compute_loss(model, inputs)
        finally:
            self._policy_forward = None
        terms: dict[str, LossTerm] = {}
        owner: dict[str, str] = {}
        for part in sorted(self.parts, key=lambda p: p.name):  # one order, whatever the order of the list
            for name, term in part.loss(self, model, inputs, forward).items():
                if name in terms:
                    raise ValueError(f"the parts {owner[name]!r} and {part.name!r} both return a loss term named "
                                     f"{name!r}: term names must be unique (rename one part's term)")
                terms[name], owner[name] = (term if isinstance(term, LossTerm) else LossTerm(term)), part.name
        return self.combine_loss(loss, terms, inputs)

    def combine_loss(self, grpo_loss, terms: dict, inputs):
        """The loss of a micro-batch from GRPO's (already scaled for gradient accumulation, as GRPO scales it) and
        the parts' named terms (:class:`LossTerm`), the same whatever the order of the parts: the terms are added in
        the order of their names, per batch, and divided by the gradient accumulation steps in training.
        ``args.loss_combination``: ``"sum"`` adds every batch's loss (DPH-RL's eq. 7); ``"count_weighted"`` weights
        each batch's loss by its rows on this process, ``sum_b n_b L_b / sum_b n_b`` (DPH-RL's authors' code: the
        rollout batch and the D_pef batch as one batch of rows). Each term is logged under ``loss/<name>``; then
        every part's :meth:`Part.after_loss` sees each batch's loss (not scaled for accumulation)."""
        mode = "train" if self.model.training else "eval"
        scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if not terms:  # GRPO's loss alone; every part's after_loss still sees it
            for part in self.parts:
                part.after_loss(self, {"rollout": grpo_loss.detach() * scale})
            return grpo_loss
        metrics, gather = self._metrics[mode], self.accelerator.gather
        batches = {"rollout": grpo_loss}
        rows = {"rollout": inputs["completion_ids"].size(0)}
        for name in sorted(terms):
            term = terms[name]
            metrics[f"loss/{name}"].append(gather(term.value.detach().reshape(1)).mean().item())
            scaled = term.value / scale
            batches[term.batch] = batches[term.batch] + scaled if term.batch in batches else scaled
            if term.batch != "rollout":
                if mode == "train" and self._reentrant_zero3:  # a part that did not set forwards_own_batch
                    raise ValueError(second_forward_refusal(type(self).__name__,
                                                             f"loss term {name!r} (batch {term.batch!r})"))
                if term.rows is None or rows.get(term.batch, term.rows) != term.rows:
                    raise ValueError(f"loss term {name!r} on batch {term.batch!r} must say its rows (the same for "
                                     "every term on that batch)")
                rows[term.batch] = term.rows
        names = ["rollout", *sorted(b for b in batches if b != "rollout")]
        if len(names) == 1:  # every term is on the rollout batch: both combinations are the sum
            loss = batches["rollout"]
        elif self.loss_combination == "sum":
            loss = batches["rollout"]
            for b in names[1:]:
                loss = loss + batches[b]
        else:
            weighted = rows["rollout"] * batches["rollout"]
            for b in names[1:]:
                weighted = weighted + rows[b] * batches[b]
            loss = weighted / sum(rows[b] for b in names)
        unscaled = {b: batches[b].detach() * scale for b in names}
        for part in self.parts:
            part.after_loss(self, unscaled)
        return loss

    # ------------------------------------------------------------------------------- helpers for the parts ---
    def _score(self, model, prompts, completions, entropy=False):
        """Per-token log-probs (and entropies) of ``completions`` given ``prompts`` (token-id lists) under ``model``,
        laid out and scored as GRPO scores a batch; returns ``(logps, entropies, completion_mask)``."""
        device = self.accelerator.device
        ids, attn, P = pack_prompt_completion(prompts, completions, self.processing_class.pad_token_id)
        logps, ent, _ = self._get_per_token_logps_and_entropies(
            model, ids.to(device), attn.to(device), ids.size(1) - P, batch_size=self.args.per_device_train_batch_size,
            compute_entropy=entropy)
        return logps, ent, attn[:, P:].to(device)

    def global_token_mean(self, values, mask):
        """For a loss term: this process's share of the token mean of ``values`` over the global batch,
        ``sum_local / (N / P)`` with ``N`` the unmasked entries of all processes and ``P`` the processes. Averaged over
        processes (as DDP averages gradients) it is the mean over the whole batch, whatever the number of processes
        and however the entries are spread; differentiable in ``values``. ``mask``: 0/1, the shape of ``values``
        (a row mean: per-row values and a mask of ones). Every process must call it (it gathers)."""
        n_tokens = self.accelerator.gather(mask.sum().detach().reshape(1)).sum().clamp(min=1.0)
        return (values * mask).sum() * self.accelerator.num_processes / n_tokens

    def global_mean(self, values, mask=None) -> float:
        """For a metric or a decision every process must share: the mean of ``values`` over the unmasked entries
        (all entries when ``mask`` is None) of every process, a float, the same on every process (no gradient).
        Every process must call it (it reduces)."""
        values = values.detach()
        mask = torch.ones_like(values) if mask is None else mask.detach()
        totals = self.accelerator.reduce(torch.stack([(values * mask).sum(), mask.sum().to(values.dtype)]), "sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    @property
    def mode(self) -> str:
        """``"train"`` or ``"eval"``: which metrics a hook is writing to now."""
        return "train" if self.model.training else "eval"

    def log_metric(self, name: str, value: float) -> None:
        """Record ``value`` under ``name`` for the next log of the current mode (``eval_`` prefixed in evaluation);
        the logged number is the mean of the values recorded since the last log. Only the main process's values
        are logged: give a value that is the same on every process (e.g. :meth:`global_mean`)."""
        self._metrics[self.mode][name].append(float(value))

    def _sync_vllm(self):
        """Push the current weights into the vLLM engine (a part that edits the weights for a rollout)."""
        if self.use_vllm:
            self.vllm_generation.sync_weights()

    # ---------------------------------------------------------------------------------------- checkpointing ---
    def _extra_state(self) -> dict:
        state, owner = {}, {}
        for part in self.parts:
            for key, value in part.state().items():
                if key in state:  # one would overwrite the other in the checkpoint, and both would read it back
                    raise ValueError(f"the parts {owner[key]!r} and {part.name!r} both keep a state named {key!r}: "
                                     "state keys must be unique across parts (prefix them with the part's name)")
                state[key], owner[key] = value, part.name
        return state

    def _load_extra_state(self, state: dict) -> None:
        mine = set()
        for part in self.parts:
            keys = set(part.state())
            part.load_state({k: v for k, v in state.items() if k in keys})
            mine |= keys
        if set(state) - mine:
            raise ValueError(f"{type(self).__name__} keeps no state named {sorted(set(state) - mine)} (the checkpoint "
                             "was written with other parts)")
