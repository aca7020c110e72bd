"""Each paper's claim, tested at toy scale against TRL's own GRPOTrainer, with 95% confidence intervals over seeds.

    python benchmarks/replicate.py                                 # the committed results/replication/ (see README)
    python benchmarks/replicate.py --seeds 0 1 --steps 60 --out /tmp/quick   # a quick look

Each paper's claim in its paper's regime (sibling studies, commands in ``benchmarks/run_all.sh``):

    # A*-PO: 25 epochs over 128 prompts, equal prompts per step, GRPO with G = 2 (the paper's Table A.5 setting)
    python benchmarks/replicate.py --methods grpo apo --G 2 --apo_batch 16 --train_prompts 128 --k 8 \
        --temperatures 1.0 --work_dir outputs/replication_apo_regime --out results/replication_apo_regime
    # DPH-RL, EEPO and the composed ERPO + DPH-RL trainer on the hard split (benchmarks/heldout_split.py), k = 64,
    # held-out entropy during training
    python benchmarks/replicate.py --methods grpo eepo dph composed --split hard --k 64 --temperatures 1.0 \
        --entropy_every 50 --work_dir outputs/replication_hard_split --out results/replication_hard_split

Every method trains from the same base model (the shipped tiny default unless ``--base_model``) on the same training
prompts, with the same step budget, learning rate, completions per step (32), completion length, temperature and
seed as GRPO; each method adds only its own paper's additions with the paper's defaults (nothing is tuned for one
method). A*-PO samples one completion per prompt (its paper's setting), so it sees 32 prompts per step: the same
number of generated sequences. Every final model and the base are then evaluated on the held-out test split
(greedy, avg@k / pass@k at several temperatures, token entropy, KL to the base, keep rate, ERPO's Query-KL).

A number is reported as mean +- the 95% confidence half-width over seeds (Student t). The verdict rules are fixed in
``results/claims_protocol.md``, written before the runs they judge. A claim *holds* when every part holds and *does not
hold* when one part does not; anything else is *inconclusive*. An "above" / "below" / "lower" / "less" part holds when
the two 95% intervals are apart in the claimed direction and does not hold when they are apart the other way. An
"equal or better" / "at or above" part is non-inferiority with a margin fixed in advance (``MARGIN``, 0.03 absolute:
accuracy, pass@k, keep rate), read on the 95% t-interval of the difference A - B paired by seed (every method trains a
seed on the same prompts in the same order: ``train`` draws them and seeds the trainer with that seed): lower bound
above -0.03 holds, upper bound below -0.03 does not hold; two methods run on different seeds are not paired:
inconclusive. ``--from_json results/<study>/replication.json`` recomputes a page's verdicts from its stored per-seed
numbers alone (no training).

Each finished (method, seed) is saved in ``<work_dir>/<method>-seed<n>/run.json`` (the base's evaluation in
``<work_dir>/base.json``) and reused when the script
is run again with the same settings, so an interrupted replication continues where it stopped (and more seeds can be
added later); the wall time reported is the sum of the recorded runs. A run whose training settings match but whose
evaluation settings differ (``--k``, ``--temperatures``, and ``--eval_levels`` / ``--split`` unless ``--entropy_every``
reads them during training) is not trained again: its saved model is evaluated again (its wall time then counts its
setup, its training and the new evaluation).

Writes ``--out`` (default ``results/replication/``): ``replication.json`` (every number, per seed),
``README.md`` (claim table, settings, seeds, wall time, the command), ``claims.png`` (the headline: each claim's
numbers with 95% CI whiskers), ``training_curves.png``, ``pass_at_k.png`` and ``accuracy_vs_temperature.png`` (mean
with 95% CI bands).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from trl_variants.default import LEVELS
from trl_variants.registry import PAPER_METHODS, REGISTRY, method_classes

ROOT = Path(__file__).resolve().parent.parent
METHODS = ["grpo", "erpo", "eepo", "dph", "apo"]
COMPOSED = "composed"  # ERPO's query weights and Query-KL with DPH-RL's rehearsal in one ComposedTrainer (its defaults)
PAPER_KEY = {REGISTRY[name].label: name for name in PAPER_METHODS}
LABELS = {"base": "base", **{name: REGISTRY[name].label for name in METHODS}, COMPOSED: "ERPO + DPH-RL (composed)"}


# ------------------------------------------------------------------------------------------------ statistics ---
MARGIN = 0.03  # non-inferiority margin, absolute, of every "equal or better" part (accuracy, pass@k, keep rate)
PROTOCOL = "results/claims_protocol.md"  # the rules, written down before the runs they judge
SEED = "seed"  # each per-seed row's seed (rows read from older replication.json files get theirs from --seeds)


def t_quantile_975(df: int) -> float:
    """Two-sided 95% Student t quantile (exact table for small df, normal beyond)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
    return table.get(df, 1.96 + 2.4 / df)


def mean_ci(values: list[float]) -> tuple[float, float]:
    """``(mean, half-width of the 95% CI)``; the half-width is NaN with fewer than two values."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    if len(vals) < 2:
        return vals[0], math.nan
    return statistics.mean(vals), t_quantile_975(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))


def by_seed(values) -> dict[int, float] | float:
    """Per-seed values as ``{seed: value}``: a mapping as given, a list as seeds 0, 1, 2, ... in order. A plain number
    is a fixed reference point (the base: one model, evaluated once), returned as is."""
    if isinstance(values, int | float):
        return float(values)
    return dict(values) if hasattr(values, "items") else dict(enumerate(values))


def interval(values) -> tuple[float, float]:
    """``(mean, 95% half-width)`` of per-seed values; a fixed reference point has half-width 0."""
    values = by_seed(values)
    return (values, 0.0) if isinstance(values, float) else mean_ci(list(values.values()))


def paired_difference(a, b) -> tuple[float, float]:
    """Mean and 95% t half-width of ``a - b`` paired by seed; NaN (no interval) when the two seed lists differ (the
    methods did not share each seed's data: not paired) or fewer than two seeds have both numbers. Against a fixed
    reference point (a number), each seed's difference to it."""
    a, b = by_seed(a), by_seed(b)
    if isinstance(a, float) and isinstance(b, float):
        return a - b, math.nan
    if not isinstance(a, float) and not isinstance(b, float) and set(a) != set(b):
        return math.nan, math.nan
    seeds = a if not isinstance(a, float) else b
    diffs = [(a if isinstance(a, float) else a[s]) - (b if isinstance(b, float) else b[s]) for s in seeds]
    diffs = [d for d in diffs if not math.isnan(d)]
    return mean_ci(diffs) if len(diffs) >= 2 else (math.nan, math.nan)


def compare(a, b, relation: str, margin: float | None = None) -> str:
    """'holds' / 'does not hold' / 'inconclusive' for ``a <relation> b`` (the rules of results/claims_protocol.md);
    ``a`` and ``b`` are per-seed values (see :func:`by_seed`).

    ``>`` / ``<`` ("above", "below", "lower", "less"): the two 95% intervals apart in the claimed direction holds,
    apart the other way does not hold, anything else is inconclusive.

    ``>=`` / ``<=`` ("equal or better", "at or above"; ``<=`` for a lower-is-better statistic): non-inferiority by
    ``margin`` (required), on the 95% t-interval of ``a - b`` paired by seed: for ``>=`` its lower bound above
    ``-margin`` holds, its upper bound below ``-margin`` does not hold (mirrored for ``<=``: upper bound below
    ``+margin`` holds, lower bound above ``+margin`` does not hold); anything else is inconclusive, and so is any pair
    whose seeds differ (not paired; no unpaired rule is used). Without an interval (one seed, or a number a run did
    not produce) there is no verdict: inconclusive."""
    if relation in (">", "<"):
        return apart_verdict(interval(a), interval(b), relation)
    if relation not in (">=", "<="):
        raise ValueError(relation)
    if margin is None or not margin >= 0:
        raise ValueError(f"{relation!r} is a non-inferiority comparison: give its margin (>= 0), got {margin}")
    return non_inferior_verdict(paired_difference(a, b), relation, margin)


def apart_verdict(a: tuple[float, float], b: tuple[float, float], relation: str) -> str:
    """The intervals-apart rule on two ``(mean, half-width)`` intervals, for ``>`` or ``<``."""
    (ma, ha), (mb, hb) = a, b
    if any(math.isnan(x) for x in (ma, mb, ha, hb)):
        return "inconclusive"
    above, below = ma - ha > mb + hb, ma + ha < mb - hb
    if relation == "<":
        above, below = below, above
    return "holds" if above else "does not hold" if below else "inconclusive"


def non_inferior_verdict(diff: tuple[float, float], relation: str, margin: float) -> str:
    """The non-inferiority rule on the paired difference's ``(mean, half-width)``, for ``>=`` or ``<=``."""
    m, h = diff
    if math.isnan(m) or math.isnan(h):
        return "inconclusive"
    lo, hi = m - h, m + h
    if relation == ">=":
        return "holds" if lo > -margin else "does not hold" if hi < -margin else "inconclusive"
    return "holds" if hi < margin else "does not hold" if lo > margin else "inconclusive"


def shown_digits(verdict: str, relation: str, a: tuple[float, float], b: tuple[float, float],
                 diff: tuple[float, float] | None = None) -> int:
    """Decimals to print a part's numbers with: 3, or more where the rounded numbers would read as another verdict
    (two intervals apart by less than 0.0005), so that a page never prints numbers its verdict contradicts."""
    def shown(x, d):
        return tuple(float(f"{v:.{d}f}") if not math.isnan(v) else v for v in x)

    for d in range(3, 7):
        again = (non_inferior_verdict(shown(diff, d), relation, MARGIN) if diff is not None
                 else apart_verdict(shown(a, d), shown(b, d), relation))
        if again == verdict:
            return d
    return 6


def column_digits(column: list[tuple[float, float]]) -> int:
    """Decimals for one column of a page's table of every number: 3, or more where rounding would show two intervals
    that are apart as touching (or two that overlap as apart), so the table agrees with the claims above it."""
    finite = [x for x in column if not any(math.isnan(v) for v in x)]

    def apart(a, b):
        return apart_verdict(a, b, ">") != "inconclusive"

    for d in range(3, 7):
        shown = [tuple(float(f"{v:.{d}f}") for v in x) for x in finite]
        if all(apart(finite[i], finite[j]) == apart(shown[i], shown[j])
               for i in range(len(finite)) for j in range(i + 1, len(finite))):
            return d
    return 6


def combine(verdicts: list[str]) -> str:
    if "does not hold" in verdicts:
        return "does not hold"
    return "holds" if all(v == "holds" for v in verdicts) else "inconclusive"


def fmt(x: tuple[float, float], digits: int = 3) -> str:
    m, h = x
    return f"{m:.{digits}f}" + ("" if math.isnan(h) else f" ± {h:.{digits}f}")


# ------------------------------------------------------------------------------------------------- training ---
def shared_settings(args, seed: int, out_dir: Path) -> dict:
    return dict(output_dir=str(out_dir), use_cpu=True, bf16=False, gradient_checkpointing=False,
                report_to="none", save_strategy="no", logging_steps=args.logging_steps, disable_tqdm=True, seed=seed,
                per_device_train_batch_size=32, num_generations=args.G, max_completion_length=args.max_len,
                temperature=1.0, learning_rate=args.lr, lr_scheduler_type="constant", max_steps=args.steps)


def study_levels(args) -> tuple[list[int] | None, list[int] | None]:
    """``--train_levels`` and ``--eval_levels`` (None: all levels; absent from older argument sets)."""
    return getattr(args, "train_levels", None), getattr(args, "eval_levels", None)


def heldout_split(args):
    """The prompts every number is read on: the standard held-out split, or (``--split hard``) the prompts of it that
    ``benchmarks/heldout_split.py`` chose from the base model's samples (results/heldout_split/)."""
    from trl_variants import load_default_dataset

    test = load_default_dataset(n_train=0, n_test=args.eval_prompts)["test"]
    _, eval_levels = study_levels(args)
    if eval_levels:  # the held-out prompts of these levels only (--split test)
        if args.split != "test":
            raise SystemExit("--eval_levels selects levels of the standard held-out split: use it with --split test")
        return test.filter(lambda level: level in eval_levels, input_columns="level")
    if args.split == "test":
        return test
    split = json.loads(Path(args.split_file).read_text())
    n = split["rule"]["eval_prompts"]  # the split's candidates: the first n prompts of the test split
    if n != args.eval_prompts:
        raise SystemExit(f"--split hard: {args.split_file} chose among the first {n} test prompts; run with "
                         f"--eval_prompts {n} (the training sets skip exactly those)")
    return test.select(split["indices"])


def entropy_prompts(args):
    """The held-out prompts whose T = 1 token entropy is measured during training (``--entropy_every``)."""
    test = heldout_split(args)
    return test.select(range(min(args.entropy_prompts, len(test))))


def entropy_callback(trainer, args):
    """EEPO's quantity where it matters: token entropy of held-out samples at T = 1, every ``--entropy_every``
    steps (logged as ``eval_passk/T1.0/entropy``), timed so that the run's wall time leaves it out."""
    from trl_variants.evaluation import EvalConfig, PassAtKCallback

    class Timed(PassAtKCallback):
        seconds = 0.0  # this callback's own time (an instance attribute from the first measurement on)

        def on_step_end(self, *a, **kw):
            t0 = time.perf_counter()
            super().on_step_end(*a, **kw)
            self.seconds += time.perf_counter() - t0

    config = EvalConfig(k=4, temperatures=[1.0], greedy=False, max_completion_length=args.max_len, seed=0,
                        show_progress=False)
    return Timed(trainer, entropy_prompts(args), config, eval_steps=args.entropy_every)


def train(method: str, seed: int, args, out_dir: Path, extra: dict | None = None) -> dict:
    """Train ``method`` on ``seed``'s data with the shared settings (``extra``: config fields on top, e.g. another
    ``dph_coef`` for benchmarks/dph_dose.py); its log history and the setup / training seconds."""
    from trl_variants import accuracy_reward, load_default_dataset

    common = shared_settings(args, seed, out_dir)
    train_levels, _ = study_levels(args)
    levels = {"levels": tuple(train_levels)} if train_levels else {}
    data = load_default_dataset(n_train=args.train_prompts, n_test=args.eval_prompts, seed=seed, **levels)["train"]
    cache = str(ROOT / "outputs" / "replication-cache")
    composed_parts = ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal"]  # ERPO + DPH-RL, said explicitly
    own = {"dph": dict(presample_cache_dir=cache), COMPOSED: dict(presample_cache_dir=cache, parts=composed_parts),
           "apo": dict(presample_cache_dir=cache, num_generations=1, lazy_value_pass=args.lazy_value_pass,
                       per_device_train_batch_size=args.apo_batch, presample_shard_size=args.apo_shard_size)}
    cls, config_cls = method_classes(method)
    t0 = time.perf_counter()
    trainer = cls(model=args.base_model, reward_funcs=accuracy_reward,
                  args=config_cls(**{**common, **own.get(method, {}), **(extra or {})}), train_dataset=data)
    setup_s = time.perf_counter() - t0  # the offline pass (A*-PO's V_hat, DPH-RL's split, ERPO's l_ref) is here
    measure = entropy_callback(trainer, args) if args.entropy_every else None
    if measure is not None:
        trainer.add_callback(measure)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0 - (measure.seconds if measure is not None else 0.0)
    trainer.save_model(str(out_dir))
    return {"history": trainer.state.log_history, "setup_s": setup_s, "train_s": train_s}


def run_settings(args) -> dict:
    """Everything a finished (method, seed) depends on; a saved run is reused only if these match."""
    keys = ["steps", "lr", "G", "max_len", "train_prompts", "eval_prompts", "k", "temperatures", "logging_steps",
            "threads", "base_model"]
    settings = {key: getattr(args, key) for key in keys}
    # the study options, recorded only when used, so the main replication's records stay reusable
    if args.split != "test":
        settings["split"] = json.loads(Path(args.split_file).read_text())["indices"]
    if args.entropy_every:
        settings |= {"entropy_every": args.entropy_every, "entropy_prompts": args.entropy_prompts}
    if args.lazy_value_pass:
        settings["lazy_value_pass"] = True
    train_levels, eval_levels = study_levels(args)
    if train_levels:
        settings["train_levels"] = train_levels
    if eval_levels:
        settings["eval_levels"] = eval_levels
    if args.apo_batch != 32:
        settings["apo_batch"] = args.apo_batch
    if args.apo_shard_size != 64:
        settings["apo_shard_size"] = args.apo_shard_size
    return settings


def saved_record(path: Path, args) -> dict | None:
    """The record at ``path`` if it exists and was made with these settings (then it is reused), else None."""
    record = json.loads(path.read_text()) if path.exists() else None
    return record if record is not None and record["settings"] == run_settings(args) else None


def evaluation_only_settings(args) -> set[str]:
    """The settings a finished run's training does not depend on: what is read after training (k, temperatures, and
    the held-out prompts when nothing is measured on them during training)."""
    keys = {"k", "temperatures"}
    return keys if args.entropy_every else keys | {"split", "eval_levels"}


def saved_training(path: Path, args) -> dict | None:
    """The record at ``path`` if its model was trained with these settings but read with other evaluation settings
    (then the saved model is evaluated again instead of trained again), else None."""
    record = json.loads(path.read_text()) if path.exists() else None
    if record is None or not (path.parent / "config.json").exists():
        return None
    skip = evaluation_only_settings(args)
    mine = {k: v for k, v in run_settings(args).items() if k not in skip}
    return record if {k: v for k, v in record["settings"].items() if k not in skip} == mine else None


def _drop_per_prompt(ev: dict) -> None:
    for entry in ev["temperatures"].values():
        entry.pop("correct", None)  # per-prompt counts: large, and the summary numbers keep what matters


def query_kl(model_path: str, base_path: str, prompts) -> float:
    """Mean k3 Query-KL of a model's prompt log-likelihoods against the base model's (ERPO's quantity)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_variants.erpo.reference import reference_prompt_logps
    from trl_variants.losses import query_kl as k3

    tok = AutoTokenizer.from_pretrained(base_path)
    base = AutoModelForCausalLM.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    l_ref = torch.tensor(reference_prompt_logps(base, tok, prompts))
    l_theta = torch.tensor(reference_prompt_logps(model, tok, prompts))
    return k3(l_theta, l_ref).mean().item()


# ---------------------------------------------------------------------------------------------- the numbers ---
def metric_mean(history: list[dict], key: str, last: int | None = None) -> float:
    vals = [h[key] for h in history if key in h]
    vals = vals[-last:] if last else vals
    return statistics.mean(vals) if vals else math.nan


HELDOUT_ENTROPY = "eval_passk/T1.0/entropy"  # logged by --entropy_every's callback


def entropy_decay(history: list[dict], window: int = 3) -> float:
    """Training-rollout token entropy: mean of the first ``window`` logs minus mean of the last ``window``."""
    vals = [h["entropy"] for h in history if "entropy" in h]
    if len(vals) < 2 * window:
        return math.nan
    return statistics.mean(vals[:window]) - statistics.mean(vals[-window:])


def per_seed_numbers(run: dict, ev: dict, k: int, t: str) -> dict[str, float]:
    e = ev["temperatures"][t]
    hist = run.get("history", [])
    return {
        "greedy": ev["greedy"], f"avg@{k}": e[f"avg@{k}"], f"pass@{k}": e["pass@k"][str(k)],
        "pass@1": e["pass@k"]["1"], "entropy": e.get("entropy", math.nan),
        "kl_to_base": e.get("kl_to_reference", math.nan), "keep_rate": e.get("keep_rate", math.nan),
        "query_kl": ev.get("query_kl", math.nan), "wall_s": run.get("setup_s", 0.0) + run.get("train_s", 0.0),
        "train_entropy_decay": entropy_decay(hist),
        "heldout_entropy": metric_mean(hist, HELDOUT_ENTROPY),
        "eepo_stage1_entropy": metric_mean(hist, "eepo/entropy_stage1"),
        "eepo_stage2_entropy": metric_mean(hist, "eepo/entropy_stage2"),
    }


def summarize(per_seed: dict[str, list[dict]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Mean +- 95% half-width of every number over seeds; the base is one model evaluated once (fixed evaluation
    seed): a fixed reference point, not a seed sample (half-width 0)."""
    stats = {m: {key: mean_ci([row[key] for row in rows]) for key in rows[0] if key != SEED}
             for m, rows in per_seed.items()}
    if "base" in stats:
        stats["base"] = {key: (m, 0.0) for key, (m, _) in stats["base"].items()}
    return stats


def seed_values(per_seed: dict[str, list[dict]], method: str, key: str) -> dict[int, float] | float:
    """One number of one method, ``{seed: value}`` (rows without a seed count as seeds 0, 1, ... in order); the base's
    as a fixed reference point (a number)."""
    rows = per_seed[method]
    if method == "base":
        return float(rows[0].get(key, math.nan))
    return {row.get(SEED, i): row.get(key, math.nan) for i, row in enumerate(rows)}


RULE_APART = "95% intervals apart"
RULE_NON_INFERIOR = f"non-inferiority: paired 95% t-interval of the difference vs margin {MARGIN}"


def claims(per_seed: dict[str, list[dict]], k: int) -> list[dict]:
    """One line per paper: the claim, the numbers and the verdict, by the rules of results/claims_protocol.md (see
    :func:`compare`), from the per-seed numbers (``{method: [one row per seed]}``, the base's one row)."""
    stats = summarize(per_seed)
    g, out = stats.get("grpo"), []

    def line(paper, claim, parts, labels=None):
        """``parts``: (part name, number name, (method, key), (method, key), relation), in the figure's order."""
        labels = labels or {number: (LABELS[PAPER_KEY[paper]], LABELS["grpo"]) for _, number, *_ in parts}
        verdicts, numbers, differences, rules, digits, relations, seeds = {}, {}, {}, {}, {}, {}, {}
        for name, number, (ma, ka), (mb, kb), relation in parts:
            a, b = seed_values(per_seed, ma, ka), seed_values(per_seed, mb, kb)
            seeds[number] = [a, b]  # per seed ({seed: value}; the base: one number), drawn on the figure
            non_inferior = relation in (">=", "<=")
            verdicts[name] = compare(a, b, relation, MARGIN if non_inferior else None)
            numbers[number] = (interval(a), interval(b))
            rules[name], relations[name] = RULE_NON_INFERIOR if non_inferior else RULE_APART, relation
            if non_inferior:
                differences[number] = paired_difference(a, b)
            digits[number] = shown_digits(verdicts[name], relation, *numbers[number], differences.get(number))
        out.append({"paper": paper, "claim": claim, "verdict": combine(list(verdicts.values())), "parts": verdicts,
                    "numbers": numbers, "labels": labels, "differences": differences, "rules": rules,
                    "relations": relations, "digits": digits, "seeds": seeds})

    if g and "erpo" in stats:
        line("ERPO", "lower Query-KL than GRPO at equal or better accuracy",
             [("Query-KL lower", "Query-KL", ("erpo", "query_kl"), ("grpo", "query_kl"), "<"),
              ("greedy accuracy equal or better", "greedy", ("erpo", "greedy"), ("grpo", "greedy"), ">=")])
    if g and "eepo" in stats:
        s, nan = stats["eepo"], (math.nan, math.nan)
        if not math.isnan(s.get("heldout_entropy", nan)[0]) and not math.isnan(g.get("heldout_entropy", nan)[0]):
            # both start from the same base: more held-out entropy across training = slower decay
            decay = ("entropy decays slower", "held-out entropy across training (T = 1)",
                     ("eepo", "heldout_entropy"), ("grpo", "heldout_entropy"), ">")
        else:  # training rollouts only (the main replication)
            decay = ("entropy decays slower", "entropy decay (first - last logs)", ("eepo", "train_entropy_decay"),
                     ("grpo", "train_entropy_decay"), "<")
        line("EEPO", "stage-2 entropy above stage-1, slower entropy decay than GRPO, equal or better accuracy",
             [("stage-2 entropy above stage-1", "stage-2 vs stage-1 entropy", ("eepo", "eepo_stage2_entropy"),
               ("eepo", "eepo_stage1_entropy"), ">"),
              decay,
              ("greedy accuracy equal or better", "greedy", ("eepo", "greedy"), ("grpo", "greedy"), ">=")],
             {"stage-2 vs stage-1 entropy": ("EEPO stage 2", "EEPO stage 1"),
              decay[1]: ("EEPO", LABELS["grpo"]), "greedy": ("EEPO", LABELS["grpo"])})
    if g and "dph" in stats:
        line("DPH-RL", f"pass@{k} at or above GRPO and keep rate at or above GRPO (where GRPO's pass@{k} shrinks)",
             [(f"pass@{k} at or above GRPO", f"pass@{k}", ("dph", f"pass@{k}"), ("grpo", f"pass@{k}"), ">="),
              ("keep rate at or above GRPO", "keep rate", ("dph", "keep_rate"), ("grpo", "keep_rate"), ">="),
              (f"GRPO's pass@{k} below the base's", f"GRPO vs base pass@{k}", ("grpo", f"pass@{k}"),
               ("base", f"pass@{k}"), "<")],
             {f"pass@{k}": ("DPH-RL", LABELS["grpo"]), "keep rate": ("DPH-RL", LABELS["grpo"]),
              f"GRPO vs base pass@{k}": (LABELS["grpo"], "base")})
    if g and "apo" in stats:
        line("A*-PO", "equal or better accuracy in less wall time, lower KL to the base",
             [("greedy accuracy equal or better", "greedy", ("apo", "greedy"), ("grpo", "greedy"), ">="),
              ("less wall time (offline pass included)", "wall time s", ("apo", "wall_s"), ("grpo", "wall_s"), "<"),
              ("lower KL to the base", "KL to base", ("apo", "kl_to_base"), ("grpo", "kl_to_base"), "<")])
    if g and COMPOSED in stats:  # the parts together keep each part's own claim
        line("ERPO + DPH-RL", f"both parts' claims at once: lower Query-KL than GRPO (ERPO), pass@{k} at or above "
             "GRPO's (DPH-RL), equal or better accuracy",
             [("Query-KL lower", "Query-KL", (COMPOSED, "query_kl"), ("grpo", "query_kl"), "<"),
              (f"pass@{k} at or above GRPO", f"pass@{k}", (COMPOSED, f"pass@{k}"), ("grpo", f"pass@{k}"), ">="),
              ("greedy accuracy equal or better", "greedy", (COMPOSED, "greedy"), ("grpo", "greedy"), ">=")],
             {name: (LABELS[COMPOSED], LABELS["grpo"]) for name in ("Query-KL", f"pass@{k}", "greedy")})
    return out


# -------------------------------------------------------------------------------------------------- plots ---
def _band(ax, xs, per_seed: list[list[float]], color, label, marker=None):
    cols = list(zip(*per_seed, strict=True))
    m_h = [mean_ci(list(c)) for c in cols]
    means = [m for m, _ in m_h]
    halves = [0.0 if math.isnan(h) else h for _, h in m_h]
    ax.plot(xs, means, "-", marker=marker, color=color, label=label)
    ax.fill_between(xs, [m - h for m, h in zip(means, halves, strict=True)],
                    [m + h for m, h in zip(means, halves, strict=True)], color=color, alpha=0.2)


def plot_training_curves(runs: dict, path: Path) -> None:
    from trl_variants.evaluation import pyplot

    plt = pyplot()
    panels = [(("reward",), "training reward"), (("entropy",), "token entropy of the rollouts"),
              (("erpo/query_kl",), "Query-KL (ERPO)"), (("eepo/entropy_stage2",), "EEPO stage-2 entropy")]
    if any(HELDOUT_ENTROPY in h for seeds in runs.values() for r in seeds for h in r["history"]):
        panels.append(((HELDOUT_ENTROPY,), "held-out token entropy (T = 1)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.5))
    for ax, (keys, title) in zip(axes, panels, strict=True):
        for i, (method, seeds) in enumerate(runs.items()):
            series = []
            for run in seeds:
                pts = [(h["step"], next(h[k] for k in keys if k in h)) for h in run["history"]
                       if any(k in h for k in keys)]
                series.append(pts)
            if not all(series):
                continue
            n = min(len(s) for s in series)
            steps = [p[0] for p in series[0][:n]]
            _band(ax, steps, [[p[1] for p in s[:n]] for s in series], f"C{i}", LABELS[method])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_eval(evals: dict, k: int, temps: list[float], out: Path) -> None:
    from trl_variants.evaluation import ks_up_to, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ks = ks_up_to(k)
    t = "1.0"  # the training temperature (main() requires it in the sweep)
    for i, (method, seeds) in enumerate(evals.items()):
        _band(ax, ks, [[e["temperatures"][t]["pass@k"][str(kk)] for kk in ks] for e in seeds],
              "k" if method == "base" else f"C{i - 1}", LABELS[method], marker="o")
    ax.set(xscale="log", xlabel="k", ylabel=f"pass@k (T={t})", ylim=(0, 1), title="pass@k, mean and 95% CI")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pass_at_k.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, (method, seeds) in enumerate(evals.items()):
        _band(ax, temps, [[e["temperatures"][str(tt)][f"avg@{k}"] for tt in temps] for e in seeds],
              "k" if method == "base" else f"C{i - 1}", LABELS[method], marker="o")
    ax.set(xlabel="sampling temperature", ylabel=f"avg@{k}", ylim=(0, 1),
           title="Accuracy vs temperature, mean and 95% CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_temperature.png", dpi=120)
    plt.close(fig)


def plot_claims(claim_lines: list[dict], path: Path) -> None:
    """The headline figure: one row per paper, one panel per number of its claim (mean and 95% CI whiskers, each
    seed's pair of values joined by a grey line, the part's verdict in the panel's title, the claim's on the left)."""
    from trl_variants.evaluation import pyplot

    plt = pyplot()
    cols = max(len(c["numbers"]) for c in claim_lines)
    fig, axes = plt.subplots(len(claim_lines), cols, figsize=(3.3 * cols, 2.5 * len(claim_lines)), squeeze=False)
    for row, c in zip(axes, claim_lines, strict=True):
        for ax in row[len(c["numbers"]):]:
            ax.axis("off")
        # numbers and parts are listed in the same order (claims()): panel i shows part i's two numbers
        for ax, (name, (a, b)), verdict in zip(row, c["numbers"].items(), c["parts"].values(), strict=False):
            means = [a[0], b[0]]
            halves = [0.0 if math.isnan(x[1]) else x[1] for x in (a, b)]
            per_seed = c.get("seeds", {}).get(name)
            if per_seed:  # each seed's pair, joined: the pairing the non-inferiority parts read
                a_seeds, b_seeds = ({str(k): v for k, v in x.items()} if isinstance(x, dict) else x for x in per_seed)
                for seed in a_seeds:
                    y_b = b_seeds.get(seed) if isinstance(b_seeds, dict) else b_seeds
                    if y_b is not None:
                        ax.plot([0.15, 0.85], [a_seeds[seed], y_b], color="0.75", linewidth=0.8, marker=".",
                                markersize=4, zorder=1)
            for x, color in ((0, "C1"), (1, "0.4")):  # points, not bars: the y axis zooms on the difference
                ax.errorbar([x], [means[x]], yerr=[halves[x]], fmt="o", color=color, capsize=6, markersize=7,
                            zorder=2)
            ax.set_xlim(-0.6, 1.6)
            ax.set_xticks([0, 1], c["labels"][name], fontsize=8)
            diff = c.get("differences", {}).get(name)  # a non-inferiority part: the paired interval it reads
            note = "" if diff is None else f"\npaired A - B {fmt(diff)} (margin -{MARGIN})"
            ax.set_title(f"{c['paper']}: {name}\n({verdict}){note}", fontsize=8)
            ax.grid(alpha=0.3, axis="y")
        row[0].set_ylabel(c["verdict"], fontsize=9, fontweight="bold")
    fig.suptitle("Each paper's claim vs TRL's GRPOTrainer (mean, 95% CI over seeds; grey: each seed's pair)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------- main ---
OFFLINE_PASS = {"erpo": "l_ref of every prompt", "dph": "D_pef / D_exp split (num_presamples per prompt)",
                "apo": "stage 1: V_hat (8 samples per prompt)", COMPOSED: "l_ref of every prompt, D_pef / D_exp split"}


def regime_rows(args) -> list[str]:
    """How each method's run sits against its paper's regime: samples per prompt, prompts per step, epochs over the
    training prompts, and what the wall time counts."""
    rows = ["| method | samples per prompt | prompts per step | epochs over the training prompts | wall time counts |",
            "|---|---|---|---|---|"]
    for method in args.methods:
        g = 1 if method == "apo" else args.G
        per_step = args.apo_batch if method == "apo" else 32 // g
        epochs = args.steps * per_step / args.train_prompts
        offline = OFFLINE_PASS.get(method)
        if method == "apo" and args.lazy_value_pass:
            shard = "the prompts" if args.apo_shard_size == 1 else f"the shards of {args.apo_shard_size} prompts"
            offline = f"stage 1, lazy: V_hat only for {shard} the run reaches"
        timed = "training" + (f" + offline pass ({offline})" if offline else "")
        rows.append(f"| {LABELS[method]} | {g} | {per_step} | {epochs:.2f} | {timed} |")
    return rows


def paired_lines(per_seed: dict, k: int = 16) -> list[str]:
    """A*-PO (and DPH-RL) against GRPO seed by seed (same seed, same prompts, run one after the other), beside the
    verdicts: DPH-RL's paired pass@k difference is the one its "at or above" part reads; A*-PO's paired wall-time
    ratio and KL difference are information only (those parts read the two intervals apart)."""
    lines = []
    if "dph" in per_seed and "grpo" in per_seed and len(per_seed["dph"]) == len(per_seed["grpo"]) >= 2:
        d, g, base = per_seed["dph"], per_seed["grpo"], per_seed["base"][0][f"pass@{k}"]
        key = f"pass@{k}"
        below = sum(y[key] < base for y in g)
        kept = sum(x[key] >= y[key] for x, y in zip(d, g, strict=True))
        diff = mean_ci([x[key] - y[key] for x, y in zip(d, g, strict=True)])
        lines += ["## DPH-RL vs GRPO, seed by seed (for information)", "",
                  f"GRPO's {key} is below the base's ({base:.3f}) in {below} of {len(g)} seeds "
                  f"({', '.join(f'{y[key]:.3f}' for y in g)}). DPH-RL's {key} is at or above GRPO's in {kept} of "
                  f"{len(d)} seeds; DPH-RL minus GRPO {fmt(diff)} (paired by seed: the interval the \"at or above\" "
                  f"verdict reads, against the margin -{MARGIN}; {PROTOCOL}).", ""]
    if "apo" not in per_seed or "grpo" not in per_seed or len(per_seed["apo"]) != len(per_seed["grpo"]) \
            or len(per_seed["grpo"]) < 2:
        return lines
    a, g = per_seed["apo"], per_seed["grpo"]
    ratio = mean_ci([x["wall_s"] / y["wall_s"] for x, y in zip(a, g, strict=True)])
    kl = mean_ci([x["kl_to_base"] - y["kl_to_base"] for x, y in zip(a, g, strict=True)])
    lower = sum(x["kl_to_base"] < y["kl_to_base"] for x, y in zip(a, g, strict=True))
    faster = sum(x["wall_s"] < y["wall_s"] for x, y in zip(a, g, strict=True))
    return [*lines, "## A*-PO vs GRPO, paired by seed (for information)", "",
            "Each seed trains both methods on the same prompts, one after the other. Paired, seed by seed (for "
            "information: the wall-time and KL parts above are \"less\" / \"lower\" parts, read on the two "
            f"intervals apart, {PROTOCOL}): A*-PO's wall time / GRPO's "
            f"{fmt(ratio)} (faster in {faster} of {len(a)} seeds); KL to the base, A*-PO minus GRPO {fmt(kl)} (lower "
            f"in {lower} of {len(a)} seeds).", ""]


def split_line(args, n_prompts: int) -> str:
    train_levels, eval_levels = study_levels(args)
    trained = ", ".join(map(str, train_levels or LEVELS))
    if eval_levels:
        levels = ", ".join(map(str, eval_levels))
        shifted = not set(eval_levels) & set(train_levels or LEVELS)
        return (f"Training prompts of levels {trained}; held-out: the standard test split's {n_prompts} prompts of "
                f"levels {levels}" + (" (levels no training prompt has: a shifted distribution, as the DPH-RL "
                                      "paper's cross-domain test sets; the base's pass rates by level are in "
                                      "results/heldout_split/README.md)." if shifted else "."))
    if train_levels:
        return f"Training prompts of levels {trained}; held-out: the standard test split, {n_prompts} prompts."
    if args.split == "test":
        return f"Held-out: the standard test split, {n_prompts} prompts."
    return (f"Held-out: the **hard split**, {n_prompts} prompts of the test split the base solves only sometimes, "
            "chosen from the base's samples before any trained model was evaluated (results/heldout_split/README.md).")


def passk_lines(evals: dict, k: int) -> list[str]:
    """pass@j at T = 1 for j = 1, 2, 4, ..., k, mean +- 95% CI over seeds: where a method crosses the base."""
    js = [str(2 ** i) for i in range(k.bit_length()) if 2 ** i <= k]
    if k < 4 or not evals:
        return []
    lines = [f"## pass@j by j (T = 1, n = {k} samples per prompt)", "",
             "| method | " + " | ".join(f"pass@{j}" for j in js) + " |", "|---|" + "---|" * len(js)]
    for method, evs in evals.items():
        cells = []
        for j in js:
            vals = [e["temperatures"]["1.0"]["pass@k"][j] for e in evs]
            mean, half = mean_ci(vals) if len(vals) > 1 else (vals[0], 0.0)
            cells.append(f"{mean:.3f} ± {half:.3f}" if len(vals) > 1 else f"{mean:.3f}")
        lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def protocol_link(out: Path) -> str:
    """results/claims_protocol.md as a link from a page written into ``out``."""
    target = ROOT / PROTOCOL
    try:
        return f"[{PROTOCOL}]({os.path.relpath(target, out.resolve())})" if out.resolve().is_relative_to(ROOT) \
            else f"`{PROTOCOL}`"
    except ValueError:  # another drive
        return f"`{PROTOCOL}`"


def rule_line(out: Path) -> str:
    """The verdict rules, as results/claims_protocol.md states them."""
    return (f"Mean ± 95% CI (Student t over seeds). Verdicts by the rules fixed in {protocol_link(out)}: an \"above\" / "
            "\"below\" / \"lower\" / \"less\" part holds when the two 95% intervals are apart in the claimed "
            "direction and does not hold when they are apart the other way; an \"equal or better\" / \"at or above\" "
            "part is non-inferiority, paired by seed (the same seed trains every method on the same prompts in the "
            f"same order): the 95% t-interval of the difference (method - comparison) entirely above -{MARGIN} holds, "
            f"entirely below -{MARGIN} does not hold; anything else is inconclusive (overlapping intervals included). "
            "A claim holds when every part holds and does not hold when one part does not.")


def claim_numbers(c: dict) -> str:
    """The numbers column of one claim line: each part's two numbers, and a non-inferiority part's paired difference."""
    cells = []
    for name, (a, b) in c["numbers"].items():
        diff, d = c.get("differences", {}).get(name), c.get("digits", {}).get(name, 3)
        cells.append(f"{name}: {fmt(a, d)} vs {fmt(b, d)}"
                     + ("" if diff is None else f", paired difference {fmt(diff, d)}"))
    return "; ".join(cells)


def write_page(out: Path, args, stats: dict, claim_lines: list[dict], wall_s: float, k: int,
               n_prompts: int | None = None, per_seed: dict | None = None, evals: dict | None = None,
               command: str | None = None, rebuilt_by: str | None = None) -> str:
    """The results page; ``command`` is the one that trained (default: this process's), ``rebuilt_by`` the
    ``--from_json`` command that recomputed the verdicts from replication.json alone (None: made by training)."""
    command = command or " ".join(["python", "benchmarks/replicate.py", *sys.argv[1:]])
    cols = ["greedy", f"avg@{k}", f"pass@{k}", "entropy", "kl_to_base", "keep_rate", "query_kl", "wall_s"]
    if args.entropy_every:  # the mean of the held-out entropy measured during training
        cols.insert(4, "heldout_entropy")
    lines = [
        "# Replication: each paper's claim at toy scale, against TRL's GRPOTrainer",
        "",
        f"Made by `{command}` "
        f"({len(args.seeds)} seed{'s' if len(args.seeds) > 1 else ''}: {args.seeds}; total wall time "
        f"{wall_s / 60:.0f} min on this machine).",
        f"Base model `{Path(args.base_model).name}`; {args.steps} steps, learning rate {args.lr}, 32 completions per "
        f"step (G = {args.G}; A*-PO: 1 per prompt), completion length {args.max_len}, T = 1.0; "
        f"{args.train_prompts} training prompts, {args.eval_prompts} held-out prompts, k = {k}.",
        rule_line(out) + (f" Verdicts and claims.png recomputed from this folder's replication.json alone (no "
                          f"retraining) by `{rebuilt_by}`." if rebuilt_by else ""),
        split_line(args, n_prompts or args.eval_prompts)
        + (f" Held-out token entropy at T = 1 measured every {args.entropy_every} steps on "
           f"{min(args.entropy_prompts, n_prompts or args.eval_prompts)} of these prompts (4 samples each; its time left "
           "out of the wall time)."
           if args.entropy_every else ""),
        "",
        "## Regime",
        "",
        *regime_rows(args),
        "",
        "## Claims",
        "",
    ]
    if claim_lines:
        lines += ["| paper | claim | verdict | numbers (method vs comparison) |", "|---|---|---|---|"]
    else:
        lines.append(f"None: a claim compares a method with GRPO, and this run trained only {args.methods}.")
    for c in claim_lines:
        nums = claim_numbers(c)
        parts = ", ".join(f"{p}: {v}" for p, v in c["parts"].items())
        lines.append(f"| {c['paper']} | {c['claim']} | **{c['verdict']}** ({parts}) | {nums} |")
    lines += ["", *paired_lines(per_seed or {}, k), *passk_lines(evals or {}, k),
              "## Every number (held-out set, T = 1.0 unless stated)", "",
              "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    digits = {c: column_digits([s[c] for s in stats.values()]) for c in cols}
    for method, s in stats.items():
        lines.append(f"| {LABELS[method]} | " + " | ".join(fmt(s[c], digits[c]) for c in cols) + " |")
    lines += [""] + (["![claims](claims.png)", ""] if claim_lines else [])
    lines += ["![training curves](training_curves.png)", "", "![pass@k](pass_at_k.png)", "",
              "![accuracy vs temperature](accuracy_vs_temperature.png)", ""]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


# the options a replication.json from before they existed was made without (their defaults then and now)
OPTION_DEFAULTS = {"split": "test", "split_file": str(ROOT / "results" / "heldout_split" / "split.json"),
                   "train_levels": None, "eval_levels": None, "entropy_every": 0, "entropy_prompts": 100,
                   "apo_batch": 32, "apo_shard_size": 64, "lazy_value_pass": False}


def with_seeds(per_seed: dict[str, list[dict]], seeds: list[int]) -> dict[str, list[dict]]:
    """Each method's rows with their seed: main() trains every method on ``--seeds`` in that order, one row each."""
    out = {}
    for method, rows in per_seed.items():
        if method != "base" and len(rows) != len(seeds):
            raise SystemExit(f"{method} has {len(rows)} per-seed rows for the seeds {seeds}: cannot pair them")
        out[method] = rows if method == "base" else [{SEED: s} | row for s, row in zip(seeds, rows, strict=True)]
    return out


def display_path(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def rebuild(path: Path) -> dict:
    """Rewrite a results folder's README.md and claims.png (and the verdicts stored in its replication.json) from
    its replication.json alone, by today's rules: no model is trained, loaded or evaluated."""
    path = Path(path)
    data = json.loads(path.read_text())
    if "per_seed" not in data or "command" not in data:
        raise SystemExit(f"{path}: no per-seed numbers (written by an older replicate.py): nothing to rebuild")
    args = argparse.Namespace(**(OPTION_DEFAULTS | data["settings"]))
    per_seed = with_seeds(data["per_seed"], args.seeds)
    stats, claim_lines = summarize(per_seed), claims(per_seed, args.k)
    out = path.parent
    if claim_lines:
        plot_claims(claim_lines, out / "claims.png")
    trained_by = data["command"].split(maxsplit=1)  # sys.argv joined: the script's path, then its arguments
    command = " ".join(["python", "benchmarks/replicate.py", *trained_by[1:]])
    n_prompts = data["evaluations"]["base"][0].get("num_prompts")
    page = write_page(out, args, stats, claim_lines, data["wall_s"], args.k, n_prompts, per_seed,
                      data["evaluations"], command=command,
                      rebuilt_by=f"python benchmarks/replicate.py --from_json {display_path(path)}")
    data["claims"] = claim_lines
    path.write_text(json.dumps(data, indent=1, default=str))
    return {"stats": stats, "claims": claim_lines, "per_seed": per_seed, "page": page}


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--train_prompts", type=int, default=2000)
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=[*METHODS, COMPOSED],
                    help=f"methods to train (default: the four papers' and GRPO; {COMPOSED!r}: ERPO's parts and "
                         "DPH-RL's rehearsal in one trainer)")
    ap.add_argument("--eval_prompts", type=int, default=500)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    ap.add_argument("--logging_steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "replication"))
    ap.add_argument("--work_dir", default=str(ROOT / "outputs" / "replication"),
                    help="trained models and the per-run records (run.json) that let a rerun continue")
    ap.add_argument("--base_model", default=None, help="start every method from this model (default: the shipped one)")
    ap.add_argument("--split", choices=["test", "hard"], default="test",
                    help="read every number on the held-out split, or on its hard prompts (--split_file)")
    ap.add_argument("--split_file", default=str(ROOT / "results" / "heldout_split" / "split.json"),
                    help="the hard prompts, chosen from the base's samples by benchmarks/heldout_split.py")
    ap.add_argument("--train_levels", type=int, nargs="+", default=None,
                    help="train on problems of these levels only (default: all training levels, 1-4)")
    ap.add_argument("--eval_levels", type=int, nargs="+", default=None,
                    help="read every number on the held-out prompts of these levels only (with --split test)")
    ap.add_argument("--entropy_every", type=int, default=0,
                    help="measure held-out token entropy at T = 1 every N steps (EEPO's claim; 0 = off); its time "
                         "is left out of the wall time")
    ap.add_argument("--entropy_prompts", type=int, default=100, help="held-out prompts of that measurement")
    ap.add_argument("--apo_batch", type=int, default=32,
                    help="A*-PO's completions (= prompts) per step: 32, the others' completions per step (equal "
                         "generation per step), or 32 / G, the others' prompts per step (the paper's regime)")
    ap.add_argument("--apo_shard_size", type=int, default=64,
                    help="A*-PO's stage-1 shard (APOConfig.presample_shard_size): with --lazy_value_pass, 1 values "
                         "exactly the prompts a run reaches")
    ap.add_argument("--lazy_value_pass", action="store_true",
                    help="A*-PO samples stage 1 only for the prompts the run reaches (APOConfig.lazy_value_pass)")
    ap.add_argument("--from_json", nargs="+", default=None, metavar="REPLICATION_JSON",
                    help="train nothing: rewrite each given results folder's README.md and claims.png (and the "
                         f"verdicts in its replication.json) from its replication.json alone, by the rules of {PROTOCOL}")
    args = ap.parse_args(argv)
    if args.from_json:
        results = [rebuild(Path(p)) for p in args.from_json]
        for p, r in zip(args.from_json, results, strict=True):
            print(f"{p}: " + ("; ".join(f"{c['paper']} {c['verdict']}" for c in r["claims"]) or "no claim"))
        return results
    for name in ("train_levels", "eval_levels"):
        if getattr(args, name) and not set(getattr(args, name)) <= set(LEVELS):
            ap.error(f"--{name} must be among the training levels {list(LEVELS)} (the held-out split draws from "
                     f"them), got {getattr(args, name)}")
    if 1.0 not in args.temperatures:
        ap.error("--temperatures must include 1.0 (the training temperature; the claims are read there)")
    torch.set_num_threads(args.threads)

    from trl_variants import accuracy_reward
    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.evaluation import EvalConfig, evaluate

    args.base_model = str(args.base_model or DEFAULT_MODEL_PATH)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    test = heldout_split(args)
    config = EvalConfig(k=args.k, temperatures=args.temperatures, max_completion_length=args.max_len, seed=0)
    base_record = Path(args.work_dir) / "base.json"  # the base's evaluation, reused like the runs
    saved = saved_record(base_record, args)
    if saved is not None:
        base, compute_s = saved["evaluation"], saved["total_s"]
    else:
        base = evaluate(args.base_model, None, test, accuracy_reward, config, name="base")
        compute_s = time.perf_counter() - start  # wall time of the runs made now plus those reused from earlier runs
        base_record.parent.mkdir(parents=True, exist_ok=True)
        base_record.write_text(json.dumps({"settings": run_settings(args), "evaluation": base, "total_s": compute_s}))
    runs: dict[str, list] = {m: [] for m in args.methods}
    evals: dict[str, list] = {"base": [base]}
    for seed in args.seeds:
        for method in args.methods:
            model_dir = Path(args.work_dir) / f"{method}-seed{seed}"
            record = model_dir / "run.json"  # one finished (method, seed): reused when rerun with the same settings
            done = saved_record(record, args)
            trained = saved_training(record, args) if done is None else None
            if done is not None:
                run, ev = done["run"], done["evaluation"]
                print(f"{method} seed {seed}: reusing {record}", flush=True)
            else:
                t0 = time.perf_counter()
                if trained is not None:  # the same training, read with other k / temperatures / held-out prompts
                    print(f"{method} seed {seed}: evaluating the saved model again ({record}: other evaluation "
                          "settings)", flush=True)
                    run = trained["run"]
                    t0 -= run["setup_s"] + run["train_s"]  # its total: setup + training + this evaluation
                else:
                    run = train(method, seed, args, model_dir) | {"model_dir": str(model_dir), "seed": seed}
                ev = evaluate(str(model_dir), None, test, accuracy_reward, config, name=f"{method}-s{seed}",
                              reference_model=args.base_model, base_results=base)
                ev["query_kl"] = query_kl(str(model_dir), args.base_model, list(test["prompt"]))
                _drop_per_prompt(ev)
                run["total_s"] = time.perf_counter() - t0
                record.write_text(json.dumps({"settings": run_settings(args), "run": run, "evaluation": ev},
                                             default=str))
            runs[method].append(run)
            evals.setdefault(method, []).append(ev)
            compute_s += run["total_s"]
            print(f"{method} seed {seed}: trained {run['train_s']:.0f} s (+{run['setup_s']:.0f} s setup), greedy "
                  f"{ev['greedy']:.3f} (base {base['greedy']:.3f})", flush=True)
    base["query_kl"] = 0.0
    k, t = args.k, "1.0"
    per_seed = {"base": [per_seed_numbers({}, base, k, t)]}
    per_seed |= {m: [per_seed_numbers(r, e, k, t) | {SEED: seed}
                     for r, e, seed in zip(runs[m], evals[m], args.seeds, strict=True)] for m in args.methods}
    stats = summarize(per_seed)
    claim_lines = claims(per_seed, k)
    if claim_lines:  # GRPO and at least one method
        plot_claims(claim_lines, out / "claims.png")
    plot_training_curves(runs, out / "training_curves.png")
    plot_eval(evals, k, args.temperatures, out)
    page = write_page(out, args, stats, claim_lines, compute_s, k, len(test), per_seed, evals)
    _drop_per_prompt(base)
    (out / "replication.json").write_text(json.dumps(
        {"settings": vars(args), "command": " ".join(sys.argv), "wall_s": compute_s, "stats": stats, "claims": claim_lines,
         "per_seed": per_seed, "evaluations": evals, "histories": {m: [r["history"] for r in s] for m, s in runs.items()}},
        indent=1, default=str))
    print(page)
    return {"stats": stats, "claims": claim_lines, "per_seed": per_seed}


if __name__ == "__main__":
    main()
