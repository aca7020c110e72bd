"""The offline reference pass (stage 1) shared by ERPO, DPH-RL and A*-PO.

One pass of the frozen reference policy over the training prompts, run once before RL starts:

* ERPO needs ``l_ref(s)``, the reference log-likelihood of every prompt (one forward pass, no sampling);
* A*-PO needs N sampled completions per prompt, their rewards and ``V_hat(x)`` (its eq. 1, ``apo/value.py``);
* DPH-RL needs k sampled completions per prompt, their rewards, and for the correct ones the per-token reference
  log-probs (then ``trl_variants.dph.split.dph_split`` separates near-perfect prompts from the exploration set).

:func:`presample` returns the input dataset with new columns (see :data:`COLUMNS`). Prompts are tokenized exactly as
``GRPOTrainer`` tokenizes them. Results are cached on disk in shards keyed by the model, the dataset fingerprint and
every option that changes them: a second call loads instead of regenerating, an interrupted call resumes from its
finished shards, and each shard is seeded by its index so the result does not depend on interruptions or on the
number of processes.

Modules: ``config`` (:class:`PresampleConfig`, the columns), ``runner`` (the pass; its steps :func:`sample_shard` and
:func:`score_shard`, which ``trl_variants.evaluation`` runs on its chunks), ``hf_backend`` / ``vllm_backend`` (the
generators), ``logprobs`` (reference log-probs), ``reward_calls`` (TRL-signature reward calls), ``cache`` (key and
shard files), ``metadata`` (what a presampled dataset records, checks against a trainer's options, summary),
``stored`` (checks of a presampled dataset's columns before a trainer reads them), ``summaries`` (per-prompt
columns computed from the rewards, each declared by the method that reads it), ``random_state`` (the pass leaves
it as it found it), ``card`` (the Hub dataset card). How a trainer runs the pass (its prompt ids, reward functions,
generator; reuse of stored columns) is ``trl_variants._offline``; each algorithm's own use of the pass lives in its
sub-package (``erpo.reference``, ``dph.split``, ``apo.value``).
"""

from .cache import cache_key, default_cache_dir
from .card import dataset_card
from .config import COLUMNS, METADATA_KEY, REF_PROMPT_LOGP, PresampleConfig
from .logprobs import completion_token_logps, prompt_logps_from_ids, token_logps
from .metadata import check_presample_options, presample_options, summarize
from .reward_calls import check_reward_columns, score_completions
from .runner import HFGenerator, presample, sample_shard, score_shard

__all__ = [
    "COLUMNS",
    "HFGenerator",
    "METADATA_KEY",
    "REF_PROMPT_LOGP",
    "PresampleConfig",
    "cache_key",
    "check_presample_options",
    "check_reward_columns",
    "completion_token_logps",
    "dataset_card",
    "default_cache_dir",
    "presample",
    "presample_options",
    "sample_shard",
    "score_shard",
    "prompt_logps_from_ids",
    "score_completions",
    "summarize",
    "token_logps",
]
