"""The step-time targets of the trainers, in one place.

``bench_trainers.py`` judges its runs against them (the "Per-regime targets" table of each results file), and
``front_page.py`` writes them, with the measured ratios, into the README's results table and
``results/front_page/``. docs/RESULTS.md explains where each comes from.

Each target is a paired step-time ratio (each repetition against the baseline's run of the same repetition, median of
the repetitions) of ``variant`` over ``baseline`` (variants of ``bench_trainers.py``), at most ``bound``:

* "every device": what the method adds on top of the generation it needs must stay small on any machine;
* "throughput-bound generation": the papers' speed claims, which need generation whose cost grows with the rows (a
  GPU with continuous batching or vLLM at large batch); on a CPU, where HF ``generate`` pays a fixed cost per decoding
  step, such a target is shown but not judged.
"""

# (variant, baseline, bound, regime, what it says)
TARGETS = (
    ("erpo", "grpo_beta0", 1.01, "every device", "ERPO <= 1.01x GRPO(beta=0)"),
    ("dph", "grpo_beta0_accuracy", 1.05, "every device", "DPH-RL <= 1.05x GRPO(beta=0) with the same reward"),
    ("eepo", "grpo_two_generates", 1.20, "every device",
     "EEPO (gate on) <= 1.20x GRPO generating in its two half calls"),
    ("apo", "grpo_g2_half", 1.05, "every device", "A*-PO <= 1.05x GRPO(G=2) on the same number of rows"),
    ("apo", "a2po", 1.00, "every device", "A*-PO below TRL's A2POTrainer"),
    ("apo", "grpo_g2", 0.60, "throughput-bound generation", "A*-PO <= 0.6x GRPO(G=2) per prompt"),
    ("eepo", "grpo_beta0", 1.25, "throughput-bound generation", "EEPO (gate on) <= 1.25x GRPO"),
)


def targets_of(variant: str) -> list[tuple]:
    """The targets whose variant is ``variant``, in the order above."""
    return [t for t in TARGETS if t[0] == variant]
