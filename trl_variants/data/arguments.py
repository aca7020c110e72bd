"""The data options every command shares (:class:`DataScriptArguments`): dataset, mixture, prompt format, rewards."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trl import DatasetMixtureConfig, ScriptArguments

from ..rewards import REWARD_FUNCS
from .reward_resolution import TRL_REWARD_FUNCS

EMBEDDED = "embedded"
"""``dataset_name`` value (the default) selecting the shipped synthetic math task."""


@dataclass
class DataScriptArguments(ScriptArguments, DatasetMixtureConfig):
    """Dataset and reward options shared by the example scripts and ``trl-variants presample`` / ``evaluate``: TRL's
    ``grpo.py`` script arguments (``ScriptArguments``, ``reward_model_name_or_path``, ``reward_funcs``) and dataset
    mixtures (``DatasetMixtureConfig``), plus ours. The training-only options are
    :class:`~trl_variants.training.TrainScriptArguments`'.

    ``dataset_name``: a Hub id or local path loaded with ``datasets.load_dataset`` (``load_from_disk`` for a saved
    dataset directory, e.g. the output of ``trl-variants presample``), or ``"embedded"`` for the shipped synthetic
    task. ``datasets`` (a YAML list of ``DatasetConfig``, or ``--datasets path ...``) loads a mixture with TRL's
    ``get_dataset`` instead. The data needs a ``prompt`` column and the gold column the reward functions read
    (``solution``). The prompt can be re-templated (``prompt_format``, ``prompt_regex``, ``prompt_suffix``,
    ``system_prompt``) and filtered by length (``filter_prompt_length``) to match a paper's recipe
    (docs/recipes.md).
    """

    dataset_name: str | None = field(default=EMBEDDED, metadata={"help": "Hub id, local path or 'embedded'."})
    embedded_train_size: int = field(default=2000, metadata={"help": "Training prompts of the embedded task."})
    embedded_test_size: int = field(default=500, metadata={"help": "Held-out prompts of the embedded task."})
    embedded_seed: int = field(default=0, metadata={"help": "Seed of the embedded task's training split."})
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reward model (Hub id or local path of a sequence-classification model, num_labels=1) used "
                          "as a reward function, before --reward_funcs, as in TRL's grpo.py."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": f"Reward functions: {sorted(REWARD_FUNCS)}, TRL's {list(TRL_REWARD_FUNCS)} or a dotted "
                          "import path ('pkg.mod.func'). Default: accuracy_reward, or none when "
                          "--reward_model_name_or_path is given."},
    )
    prompt_column: str = field(
        default="prompt",
        metadata={"help": "Column with the prompt. A string column other than 'prompt' is turned into a "
                          "conversational 'prompt' (one user message: the text plus prompt_suffix); see "
                          "--prompt_format for a string column named 'prompt' and for plain text."},
    )
    prompt_suffix: str = field(default="", metadata={"help": "Appended to the prompt text (string columns)."})
    prompt_format: str = field(
        default="auto",
        metadata={"help": "How a string prompt column reaches the model. 'chat': one user message (under the model's "
                          "chat template); 'plain': the text itself (TRL applies no chat template to string "
                          "prompts); 'auto': 'chat', except a column named 'prompt' with no --prompt_suffix, "
                          "--prompt_regex or --system_prompt, which is passed on unchanged (plain). A "
                          "conversational column is always passed on (with --system_prompt prepended).",
                  "choices": ["auto", "chat", "plain"]},
    )
    prompt_regex: str | None = field(
        default=None,
        metadata={"help": "Regular expression with one capture group applied to a string prompt column (full match, "
                          "DOTALL): the group is the prompt text, e.g. the problem inside a dataset's own "
                          "instruction wrapper. A row that does not match is an error."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message prepended to every conversational prompt (e.g. DPH-RL's 'Please reason "
                          "step by step, and put your final answer within \\boxed{}.'). Not with "
                          "--prompt_format plain."},
    )
    filter_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Drop training (and eval) prompts longer than this many tokens of the model's tokenizer, "
                          "counted as the trainer tokenizes them (chat template applied to conversational prompts); "
                          "prints how many were dropped. Default: keep all (TRL 1.16's GRPOConfig has no "
                          "max_prompt_length; the offline passes' max_prompt_length truncates, it does not drop)."},
    )
    solution_column: str = field(default="solution", metadata={"help": "Gold-answer column (renamed 'solution')."})
    filter_column: str | None = field(default=None, metadata={"help": "Keep only rows whose column value ..."})
    filter_values: list[str] | None = field(default=None, metadata={"help": "... is one of these (as strings)."})
    torch_threads: int | None = field(
        default=None, metadata={"help": "torch.set_num_threads for CPU runs (default: torch's choice)."}
    )

    def __post_init__(self):
        super().__post_init__()  # DatasetMixtureConfig: YAML dicts -> DatasetConfig
        if self.reward_funcs is None:  # TRL's grpo.py has no default; ours keeps the math reward unless a model scores
            self.reward_funcs = [] if self.reward_model_name_or_path else ["accuracy_reward"]
        if self.prompt_format not in ("auto", "chat", "plain"):
            raise ValueError(f"--prompt_format must be 'auto', 'chat' or 'plain', got {self.prompt_format!r}")
        if self.prompt_format == "plain" and self.system_prompt:
            raise ValueError("--system_prompt needs a conversational prompt, but --prompt_format is 'plain' (no chat "
                             "template, so no system role): drop one of them, or put the text in --prompt_suffix")
        if self.prompt_regex is not None:
            try:
                groups = re.compile(self.prompt_regex).groups
            except re.error as e:
                raise ValueError(f"--prompt_regex {self.prompt_regex!r} is not a valid regular expression: {e}") from e
            if groups != 1:
                raise ValueError(f"--prompt_regex must have exactly one capture group (the prompt text), "
                                 f"{self.prompt_regex!r} has {groups}")
        if self.filter_prompt_length is not None and self.filter_prompt_length < 1:
            raise ValueError(f"--filter_prompt_length must be >= 1 (or unset to keep every prompt), got "
                             f"{self.filter_prompt_length}")
