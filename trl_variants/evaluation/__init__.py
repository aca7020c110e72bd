"""Evaluation as the four papers do it: greedy accuracy, avg@k and pass@k swept over sampling temperatures, token
entropy, response length, optional KL to a reference, and keep / exploration rates against a base model
(DPH-RL Sec. 6.1). Outputs a JSON file with every number (per-prompt correctness counts included), a Markdown
table and PNG plots.

A sample is correct when one reward function, the correctness function (default ``accuracy_reward``;
:func:`correctness_index`), gives it a value > 0; the other reward functions are reported beside it (their mean per
pass), never summed into correctness. A model loaded from a path goes to the accelerator (:func:`eval_device`), and
its device and dtype are printed.

>>> from trl_variants.evaluation import EvalConfig, evaluate, write_report
>>> results = evaluate("outputs/erpo-tiny", None, load_default_dataset()["test"], config=EvalConfig(k=8))
>>> write_report([results], "eval/")

The work is cut into chunks: one pass (greedy, or one temperature) over ``chunk_size`` prompts. Each chunk is sampled
and scored with the offline pass's own steps (:mod:`trl_variants.presample`: the same prompt tokenization, batched
generation, seeds and reward calls), seeded by its index, so its samples do not depend on interruptions or on the
number of processes; under ``accelerate launch`` the chunks are shared out between the processes. A progress bar
with an ETA counts prompts over all passes. With ``results_file`` every finished chunk is appended to a JSON-lines
file whose first line holds the run's key (model, weights, dataset, options, library versions): a rerun with the
same key reads the finished chunks back instead of sampling them again, and its numbers equal an uninterrupted
run's; a rerun with another key is refused, naming what differs (``restart=True`` starts over).

``backend`` picks what samples (:func:`~.sampling.make_generator`): transformers ``generate`` (``"hf"``) or an offline vLLM
engine built as the offline pass builds it, with GRPOConfig's ``vllm_*`` options (``"vllm"``). Everything after
sampling (rewards, counts, entropy, KL, the report) is the same code for both.

Modules: ``config`` (:class:`EvalConfig`), ``metrics`` (pass@k, avg@k, keep / exploration rates, the correctness
function, aggregation), ``sampling`` (one chunk, sampled and scored with the offline pass's public steps), ``resume``
(the results file), ``runner`` (:func:`evaluate`), ``report`` (JSON, Markdown, plots) and ``callbacks`` (during
training). ``trl_variants.evaluate`` is the same API under its earlier name.
"""

from .callbacks import HeldOutCallback, PassAtKCallback, callback_config, evaluate_policy
from .config import BACKENDS, VLLM_EXTRA, EvalConfig
from .metrics import (
    DEFAULT_CORRECTNESS,
    correctness_index,
    keep_and_exploration_rates,
    ks_up_to,
    pass_at_k,
    reward_labels,
)
from .report import (
    PLOTS_SKIPPED,
    have_matplotlib,
    markdown_table,
    plot_heldout_curves,
    plot_pass_at_k,
    plot_temperature_sweep,
    pyplot,
    write_report,
)
from .resume import ResultsFile, legacy_key, run_key
from .runner import evaluate
from .sampling import check_backend, eval_device, make_generator

__all__ = ["BACKENDS", "DEFAULT_CORRECTNESS", "PLOTS_SKIPPED", "VLLM_EXTRA", "EvalConfig", "HeldOutCallback",
           "PassAtKCallback", "ResultsFile", "callback_config", "check_backend", "correctness_index", "eval_device",
           "evaluate", "evaluate_policy", "have_matplotlib", "keep_and_exploration_rates", "ks_up_to", "legacy_key",
           "make_generator", "markdown_table", "pass_at_k", "plot_heldout_curves", "plot_pass_at_k",
           "plot_temperature_sweep", "pyplot", "reward_labels", "run_key", "write_report"]
