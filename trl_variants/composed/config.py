"""Configuration of :class:`~trl_variants.ComposedTrainer`: ERPO's, DPH-RL's and EEPO's options in one config, and
the list of parts to run. Each part's options are checked only when the part runs; an option of a part that does
not run, set to anything but its default, is refused by name."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass, field

from .._config_checks import check_common
from ..dapo.config import DynamicSamplingConfig
from ..dph.config import DPHConfig
from ..eepo.config import EEPOConfig
from ..erpo.config import ERPOConfig

PART_NAMES = ("erpo_query_weights", "erpo_query_kl", "dph_rehearsal", "eepo_two_stage_rollout", "dapo_dynamic_sampling")
"""The built-in parts (``trl_variants.parts.registered_parts()`` adds the ones registered with ``register_part``)."""

DEFAULT_PARTS = ("erpo_query_weights", "erpo_query_kl", "dph_rehearsal")
"""What ``ComposedConfig()`` runs when ``parts`` is not given (with a warning saying so)."""


def _own_fields(config_cls) -> list[str]:
    base = {f.name for f in dataclasses.fields(DynamicSamplingConfig)}
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in base]


_ERPO_PARTS = ("erpo_query_weights", "erpo_query_kl")
OPTION_PARTS: dict[str, tuple[str, ...]] = {
    "use_query_weights": ("erpo_query_weights",),  # the part says it: only its default (True) is accepted
    "query_weight_source": ("erpo_query_weights",),
    "query_weight_max": ("erpo_query_weights",),
    "query_kl_coef": ("erpo_query_kl",),
    "query_kl_estimator": ("erpo_query_kl",),
    "ref_prompt_logp_column": _ERPO_PARTS,  # l_ref(s): read by Query-KL and by the reference query weights
    "reference_batch_size": _ERPO_PARTS,
    # every DPH-RL field but loss_combination (the trainer's, for every part's loss terms)
    **{name: ("dph_rehearsal",) for name in _own_fields(DPHConfig) if name != "loss_combination"},
    **{name: ("eepo_two_stage_rollout",) for name in _own_fields(EEPOConfig)},
    "dynamic_sampling_max_rounds": ("dapo_dynamic_sampling",),  # dynamic_sampling=True adds the part
}
"""Each part's options: the ``ComposedConfig`` fields only that part reads (several parts: any of them)."""

GENERAL_OPTIONS = ("parts", "loss_combination", "dynamic_sampling", "low_precision_weights")
"""The fields ``ComposedConfig`` adds to ``GRPOConfig`` that belong to no one part."""

_CHECKS = ((_ERPO_PARTS, ERPOConfig._check_erpo_options), (("dph_rehearsal",), DPHConfig._check_dph_options),
           (("eepo_two_stage_rollout",), EEPOConfig._check_eepo_options))


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def unselected_options(values: dict, parts) -> list[str]:
    """The names of ``values`` (field name -> value) that are options of none of ``parts`` (names) and differ from
    their defaults: what :class:`ComposedConfig` refuses (e.g. for a command line that drops parts from a recipe's
    list)."""
    defaults = {f.name: _default(f) for f in dataclasses.fields(ComposedConfig)}
    # dph_coef's default (None) stands for DPH-RL's eta for the divergence: that value is the default too (a recipe's
    # or an older record's dph_coef: 0.2)
    accepted = {name: [default] for name, default in defaults.items()}
    accepted["dph_coef"].append(DPHConfig.default_eta(values.get("divergence", "js")))
    return [name for name, value in values.items() if name in OPTION_PARTS
            and not set(OPTION_PARTS[name]) & set(parts) and value not in accepted[name]]


def _part_name(entry) -> str:
    return entry if isinstance(entry, str) else entry.name


@dataclass
class ComposedConfig(ERPOConfig, DPHConfig, EEPOConfig):
    r"""
    Configuration for [`ComposedTrainer`]: GRPO plus any subset of the parts of ERPO, DPH-RL and EEPO, DAPO's
    dynamic sampling and parts of your own (docs/parts.md).

    Every field of [`ERPOConfig`], [`DPHConfig`] and [`EEPOConfig`] is here, with its defaults; ``parts`` decides which
    additions run. Each part's options are checked only when the part runs (an EEPO-only check never refuses an
    ERPO run), and an option of a part that is not in ``parts`` is refused by name unless it has its default value
    (it would do nothing). ERPO's ``use_query_weights`` is said by ``parts`` here (only its default, True, is
    accepted). A*-PO's regression replaces GRPO's loss and group sampling, so it is not a part (use [`APOTrainer`]).

    Parameters:
        parts (`list`, *optional*):
            the additions to run, in any order (training does not depend on it): ``erpo_query_weights`` (advantages
            times w(s), eq. 8), ``erpo_query_kl`` (``query_kl_coef`` times the Query-KL, eq. 10-11),
            ``dph_rehearsal`` (the D_pef f-divergence term after DPH-RL's offline split, eq. 5-7),
            ``eepo_two_stage_rollout`` (sample-then-forget rollouts, Algorithm 1), ``dapo_dynamic_sampling`` (DAPO's
            dynamic sampling, ``dynamic_sampling_*`` fields; ``dynamic_sampling=True`` adds it); the name of a part
            registered with ``trl_variants.register_part``, such a class, or a ``trl_variants.Part`` instance. An
            empty list is GRPO; ``["dapo_dynamic_sampling"]`` is GRPO with dynamic sampling. Not given: the default
            ``["erpo_query_weights", "erpo_query_kl", "dph_rehearsal"]``, with a warning saying so.
    """

    parts: list[str] | None = field(
        default=None,
        metadata={"help": f"Parts to run, any of {list(PART_NAMES)} (or registered parts of your own). Not given: "
                          f"{list(DEFAULT_PARTS)}, with a warning."},
    )

    # the order of the parts does not change training (the trainer combines their terms in one order): a resume
    # may list them in another
    resume_unordered_fields = ("parts",)

    def __post_init__(self):
        self._resolve_parts()
        names = self.part_names
        refused = unselected_options({name: getattr(self, name) for name in OPTION_PARTS}, names)
        if refused:
            raise ValueError("ComposedConfig: " + "; ".join(
                f"{name} is an option of part {' or '.join(map(repr, OPTION_PARTS[name]))}, which is not in "
                f"parts={names}: add the part or drop the option" for name in refused))
        if "erpo_query_weights" in names and not self.use_query_weights:
            raise ValueError("ComposedConfig: use_query_weights=False contradicts parts, which holds "
                             "'erpo_query_weights': drop the part (parts decides what runs) or the option")
        # what every part shares: TRL's checks, the numerical guards', dynamic sampling's (its one field is checked
        # above when the part does not run); then each chosen part's own (not the parent configs' __post_init__)
        check_common(self)
        DynamicSamplingConfig.__post_init__(self)
        for owners, check in _CHECKS:
            if set(owners) & set(names):
                check(self)
        if "erpo_query_kl" in names and not self.query_kl_coef > 0:
            raise ValueError("ComposedConfig.parts has 'erpo_query_kl' but query_kl_coef is 0: set query_kl_coef > 0 "
                             "(the paper's alpha is 0.01) or drop the part")
        if "eepo_two_stage_rollout" in names and self.entropy_gate == "never":
            raise ValueError("ComposedConfig.parts has 'eepo_two_stage_rollout' but entropy_gate='never' turns it off: "
                             "drop the part or set entropy_gate to 'auto' / 'always'")

    def _resolve_parts(self) -> None:
        """``parts`` as a list of names (built-in or registered) and Part instances; a Part class is registered and
        named; the default, when not given, announced."""
        if self.parts is None:
            warnings.warn(f"ComposedConfig.parts not given: running the default {list(DEFAULT_PARTS)} (ERPO's two "
                          "parts and DPH-RL's rehearsal); pass parts=[...] to choose (an empty list is GRPO)",
                          UserWarning, stacklevel=4)
            self.parts = list(DEFAULT_PARTS)
        entries = [self.parts] if isinstance(self.parts, str) else list(self.parts)
        if any(not isinstance(e, str) for e in entries):  # an instance or a class: trl_variants.parts is imported
            from ..parts import Part, register_part

            for i, entry in enumerate(entries):
                if isinstance(entry, type) and issubclass(entry, Part):
                    entries[i] = register_part(entry).name
                elif not isinstance(entry, (str, Part)):
                    raise TypeError(f"ComposedConfig.parts: {entry!r} is not a part name, a trl_variants.Part "
                                    "subclass or instance")
                elif isinstance(entry, Part) and entry.name in PART_NAMES:  # its options would bypass the records
                    raise ValueError(f"ComposedConfig.parts: give the built-in part {entry.name!r} by its name, not as "
                                     "an instance: it reads its options from the config (the run's records, model "
                                     "card and resume checks keep them there); set them on ComposedConfig")
        if self.dynamic_sampling and "dapo_dynamic_sampling" not in [_part_name(e) for e in entries]:
            entries.append("dapo_dynamic_sampling")  # one truth: the parts list
        unknown = [e for e in entries if isinstance(e, str) and e not in PART_NAMES]
        if unknown:
            from ..parts import registered_parts

            known = registered_parts()
            unknown = [e for e in unknown if e not in known]
            if unknown:
                raise ValueError(f"ComposedConfig.parts: unknown part(s) {unknown}; choose from {known} (a part of "
                                 "your own: register its class with trl_variants.register_part, or give an instance)")
        self.parts = entries
        names = self.part_names
        if len(set(names)) != len(names):
            raise ValueError(f"ComposedConfig.parts lists a part twice: {names}")
        self.dynamic_sampling = "dapo_dynamic_sampling" in names

    @staticmethod
    def inert_fields(values) -> set[str]:
        """The fields that change nothing given the others (``values``: field values, e.g. a checkpoint's record):
        ERPO's rule, and the options of every part not in ``values["parts"]``. A resume does not compare a field
        inert in both runs (a record written before ``dph_coef`` defaulted to None holds 0.2 for a run without
        ``dph_rehearsal``; this run may not set it)."""
        parts = {_part_name(p) for p in values.get("parts") or []}
        return ERPOConfig.inert_fields(values) | {name for name, owners in OPTION_PARTS.items()
                                                   if not set(owners) & parts}

    @property
    def part_names(self) -> list[str]:
        """The names of ``parts`` (an instance's ``name``)."""
        return [_part_name(e) for e in self.parts]

    # A Part instance in ``parts`` belongs to the run, not to the config's records: they keep its name.
    def to_dict(self):
        d = super().to_dict()
        d["parts"] = self.part_names
        return d

    def __str__(self):
        parts, self.parts = self.parts, self.part_names  # TrainingArguments.__str__ deep-copies every field
        try:
            return super().__str__()
        finally:
            self.parts = parts

    def __getstate__(self):  # pickled (Trainer saves training_args.bin): the names
        state = self.__dict__.copy()
        state["parts"] = self.part_names
        return state

    def __deepcopy__(self, memo):  # a copy runs the same Part instances (not copies of them)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = list(value) if key == "parts" else copy.deepcopy(value, memo)
        return new
