"""The help texts of the ``trl-variants`` commands and the top-level usage."""

from __future__ import annotations

from .errors import TRACEBACK_ENV

COMMAND_HELP = {  # the commands, in the order `trl-variants --help` lists them
    "train": "Train with ERPO, EEPO, DPH-RL, A*-PO, a combination of parts or TRL's GRPO "
             "(`train erpo|eepo|dph|apo|composed|grpo`) on a shipped recipe "
             "(--config NAME; default: the tiny CPU one) or your YAML, flags overriding it: the example scripts, "
             "inside the package.",
    "recipes": "List the recipes and accelerate configs shipped in the package (`--path NAME`: a recipe's file).",
    "presample": "Run the offline reference pass (stage 1 of A*-PO and DPH-RL, ERPO's reference prompt "
                 "log-likelihoods) over a dataset and save (or push) the result with its dataset card.",
    "evaluate": "Sample and score models on a test split: greedy accuracy, avg@k / pass@k per temperature, entropy "
                "and KL; writes results.json, results.md and, with matplotlib ('trl-variants[plots]'), plots.",
    "cache": "List (`cache list`) or remove (`cache clear [--yes] [KEY ...]`) the offline pass's cached results "
             "($TRL_VARIANTS_CACHE, default ~/.cache/trl_variants/presample, or --cache_dir).",
}

CONFIG_HELP = ("--config FILE.yaml: read the options above from a YAML file (keys are the option names without "
               "'--'); flags given on the command line override it.")
EVALUATE_CONFIG_HELP = (CONFIG_HELP + " evaluate also takes a training recipe (a path or a shipped recipe's name, "
                        "e.g. erpo/tiny_cpu; `trl-variants recipes` lists them): its model (model_name_or_path), "
                        "data, prompt, reward and sampling settings (temperature, max_completion_length, top_p...) "
                        "are used and its training-only keys are ignored (listed when it starts); a --dataset_name "
                        "on the command line replaces the recipe's data set with its filter_* / prompt_regex / "
                        "dataset_config (a benchmark is evaluated whole).")


def usage() -> str:
    """``trl-variants --help``: every command (:data:`COMMAND_HELP`, in the dispatcher's order) with its line."""
    lines = [f"usage: trl-variants {{{','.join(COMMAND_HELP)}}} [--option value ...]   (or: python -m trl_variants "
             "...)", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, text in COMMAND_HELP.items()]
    lines += ["", "Run `trl-variants COMMAND --help` for every option of a command. train, presample and evaluate "
              "take their options from a YAML file (--config FILE.yaml) and/or flags (flags override the file).",
              "Several processes: accelerate launch -m trl_variants train erpo ...   (or: accelerate launch $(which "
              "trl-variants) train erpo ...)",
              f"An error before training starts prints one line with its fix; --traceback (or {TRACEBACK_ENV}=1) "
              "shows the traceback."]
    return "\n".join(lines)
