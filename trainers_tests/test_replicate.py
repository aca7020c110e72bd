"""`benchmarks/replicate.py`: the statistics behind its claim table, and a reduced replication (1 seed, GRPO only,
a few steps) that must show RL working on the embedded default: the trained model beats the base on held-out data."""

import argparse
import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("replicate", ROOT / "benchmarks" / "replicate.py")
replicate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replicate)


def test_mean_and_95_percent_interval_by_hand():
    m, h = replicate.mean_ci([1.0, 2.0, 3.0])  # sd 1, n 3: t(0.975, 2) = 4.303 -> 4.303 / sqrt(3)
    assert m == 2.0 and h == pytest.approx(4.303 / math.sqrt(3))
    m, h = replicate.mean_ci([0.5, float("nan")])  # NaN seeds are left out; one value has no interval
    assert m == 0.5 and math.isnan(h)


@pytest.mark.parametrize("a,b,relation,verdict", [
    ((0.8, 0.05), (0.6, 0.05), ">", "holds"),            # intervals apart, right direction
    ((0.6, 0.05), (0.8, 0.05), ">", "does not hold"),    # apart, wrong direction
    ((0.7, 0.05), (0.65, 0.05), ">", "inconclusive"),    # overlapping
    ((0.1, 0.01), (0.3, 0.01), "<", "holds"),
    ((0.60, 0.05), (0.62, 0.05), ">=", "holds"),         # "equal or better": not entirely below
    ((0.40, 0.05), (0.62, 0.05), ">=", "does not hold"),
    ((0.9, float("nan")), (0.1, 0.01), ">", "inconclusive"),   # one seed: no interval, no verdict
])
def test_claim_verdicts(a, b, relation, verdict):
    assert replicate.compare(a, b, relation) == verdict


def test_a_claim_holds_only_when_every_part_does():
    assert replicate.combine(["holds", "holds"]) == "holds"
    assert replicate.combine(["holds", "inconclusive"]) == "inconclusive"
    assert replicate.combine(["inconclusive", "does not hold"]) == "does not hold"


def test_claim_table_and_headline_figure_from_known_numbers(tmp_path):
    """Made-up statistics with known verdicts: each paper's line, its parts and the figure's panels."""
    keys = ["greedy", "avg@16", "pass@16", "pass@1", "entropy", "kl_to_base", "keep_rate", "query_kl", "wall_s",
            "train_entropy_decay", "eepo_stage1_entropy", "eepo_stage2_entropy"]
    stats = {m: {key: (0.5, 0.01) for key in keys} for m in ["base", "grpo", "erpo", "eepo", "dph", "apo"]}
    stats["base"]["pass@16"] = (0.9, 0.0)
    stats["grpo"] |= {"query_kl": (0.10, 0.01), "pass@16": (0.80, 0.02), "keep_rate": (0.90, 0.01)}
    stats["erpo"] |= {"query_kl": (0.01, 0.005), "greedy": (0.52, 0.03)}            # holds
    stats["eepo"] |= {"eepo_stage2_entropy": (0.3, 0.01), "eepo_stage1_entropy": (0.31, 0.01)}  # inconclusive
    stats["dph"] |= {"pass@16": (0.70, 0.01), "keep_rate": (0.95, 0.01)}          # does not hold (pass@16 below)
    stats["apo"] |= {"wall_s": (0.4, 0.01), "kl_to_base": (0.2, 0.01)}             # holds
    lines = {c["paper"]: c for c in replicate.claims(stats, 16)}
    assert {p: c["verdict"] for p, c in lines.items()} == {
        "ERPO": "holds", "EEPO": "inconclusive", "DPH-RL": "does not hold", "A*-PO": "holds"}
    assert lines["DPH-RL"]["parts"] == {"pass@16 at or above GRPO": "does not hold",
                                        "keep rate at or above GRPO": "holds", "GRPO's pass@16 below the base's": "holds"}
    assert lines["DPH-RL"]["labels"]["GRPO vs base pass@16"] == ("GRPO (TRL)", "base")
    for c in lines.values():  # the figure pairs panel i with part i
        assert len(c["numbers"]) == len(c["parts"]) == len(c["labels"])
    replicate.plot_claims(list(lines.values()), tmp_path / "claims.png")
    assert (tmp_path / "claims.png").stat().st_size > 20_000


@pytest.mark.slow
def test_reduced_replication_grpo_beats_the_base(tmp_path, monkeypatch):
    out = tmp_path / "replication"
    argv = ["--seeds", "0", "--methods", "grpo", "--steps", "30", "--train_prompts", "256", "--eval_prompts", "200",
            "--k", "2", "--temperatures", "1.0", "--logging_steps", "5", "--threads", "1", "--out", str(out),
            "--work_dir", str(tmp_path / "work")]
    result = replicate.main(argv)
    base, grpo = result["per_seed"]["base"][0], result["per_seed"]["grpo"][0]
    assert grpo["greedy"] >= base["greedy"] + 0.10, (base["greedy"], grpo["greedy"])
    assert grpo["avg@2"] > base["avg@2"], (base["avg@2"], grpo["avg@2"])
    page = (out / "README.md").read_text()
    assert "python benchmarks/replicate.py" in page and "| GRPO (TRL) |" in page
    assert "(1 seed: [0];" in page and "None: a claim compares a method with GRPO" in page  # no empty claim table
    assert json.loads((out / "replication.json").read_text())["per_seed"]["grpo"][0]["greedy"] == grpo["greedy"]
    for png in ("training_curves.png", "pass_at_k.png", "accuracy_vs_temperature.png"):
        assert (out / png).stat().st_size > 10_000

    # a rerun with the same settings continues from the saved runs: nothing is trained again, same numbers
    monkeypatch.setattr(replicate, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = replicate.main(argv)
    assert again["per_seed"]["grpo"] == result["per_seed"]["grpo"]

    # other evaluation settings only (k): the saved model is evaluated again, not trained again
    other_k = replicate.main([*argv[: argv.index("--k") + 1], "3", *argv[argv.index("--k") + 2:]])
    assert "avg@3" in other_k["per_seed"]["grpo"][0] and "avg@2" not in other_k["per_seed"]["grpo"][0]
    assert other_k["per_seed"]["grpo"][0]["greedy"] == grpo["greedy"]  # the same model, the same greedy answers


def test_eepo_claim_is_read_on_held_out_entropy_when_measured():
    """With --entropy_every both runs log held-out entropy: "decays slower" compares it (higher = slower decay, both
    start from the same base); without it the training-rollout decay is compared, as in the main replication."""
    keys = ["greedy", "pass@16", "keep_rate", "query_kl", "kl_to_base", "wall_s", "train_entropy_decay",
            "eepo_stage1_entropy", "eepo_stage2_entropy", "heldout_entropy"]
    stats = {m: {key: (0.5, 0.01) for key in keys} for m in ["base", "grpo", "eepo"]}
    stats["eepo"] |= {"heldout_entropy": (0.30, 0.01), "train_entropy_decay": (0.9, 0.01)}  # rollouts: decays faster
    stats["grpo"] |= {"heldout_entropy": (0.20, 0.01)}
    (line,) = replicate.claims(stats, 16)
    assert line["parts"]["entropy decays slower"] == "holds"
    assert line["numbers"]["held-out entropy across training (T = 1)"] == ((0.30, 0.01), (0.20, 0.01))
    stats["grpo"]["heldout_entropy"] = (math.nan, math.nan)  # not measured: the rollouts' decay (0.9 vs 0.5)
    (line,) = replicate.claims(stats, 16)
    assert line["parts"]["entropy decays slower"] == "does not hold"
    assert "entropy decay (first - last logs)" in line["numbers"]


def test_regime_table_counts_epochs_and_what_is_timed():
    args = argparse.Namespace(methods=["grpo", "apo", "dph"], G=8, steps=200, train_prompts=200, lazy_value_pass=False,
                              apo_batch=32, apo_shard_size=64)
    rows = replicate.regime_rows(args)
    assert rows[2] == "| GRPO (TRL) | 8 | 4 | 4.00 | training |"  # 200 steps x 4 prompts / 200 prompts
    assert rows[3].startswith("| A*-PO | 1 | 32 | 32.00 | training + offline pass (stage 1")
    assert rows[4].startswith("| DPH-RL | 8 | 4 | 4.00 | training + offline pass (D_pef")
    args.lazy_value_pass, args.G, args.apo_batch = True, 2, 16  # the paper's regime: equal prompts per step
    assert replicate.regime_rows(args)[2] == "| GRPO (TRL) | 2 | 16 | 16.00 | training |"
    assert replicate.regime_rows(args)[3].startswith("| A*-PO | 1 | 16 | 16.00 | training + offline pass (stage 1, lazy")


@pytest.mark.slow
def test_hard_split_and_held_out_entropy_during_training(tmp_path):
    """--split hard reads the chosen prompts of the test split; --entropy_every logs held-out entropy during training,
    which becomes the run's heldout_entropy; a split chosen among other prompts than --eval_prompts is refused."""
    from trl_variants import load_default_dataset

    split = tmp_path / "split.json"
    split.write_text(json.dumps({"rule": {"candidates": "the first 40 prompts of the test split (seed 999)",
                                          "eval_prompts": 40},
                                 "indices": [1, 4, 9, 16, 25, 36]}))
    argv = ["--seeds", "0", "--methods", "grpo", "--steps", "4", "--train_prompts", "64", "--eval_prompts", "40",
            "--k", "2", "--temperatures", "1.0", "--logging_steps", "2", "--threads", "1", "--split", "hard",
            "--split_file", str(split), "--entropy_every", "2", "--entropy_prompts", "4",
            "--out", str(tmp_path / "out"), "--work_dir", str(tmp_path / "work")]
    test = load_default_dataset(n_train=0, n_test=40)["test"]
    chosen = replicate.heldout_split(argparse.Namespace(split="hard", split_file=str(split), eval_prompts=40))
    assert chosen["prompt"] == [test[i]["prompt"] for i in (1, 4, 9, 16, 25, 36)]
    result = replicate.main(argv)
    record = json.loads((tmp_path / "work" / "grpo-seed0" / "run.json").read_text())
    logged = [h[replicate.HELDOUT_ENTROPY] for h in record["run"]["history"] if replicate.HELDOUT_ENTROPY in h]
    assert len(logged) == 2 and all(x > 0 for x in logged)  # steps 2 and 4
    assert result["per_seed"]["grpo"][0]["heldout_entropy"] == pytest.approx(sum(logged) / 2)
    assert record["settings"]["split"] == [1, 4, 9, 16, 25, 36]
    page = (tmp_path / "out" / "README.md").read_text()
    assert "the **hard split**, 6 prompts" in page and "| GRPO (TRL) | 8 | 4 | 0.25 | training |" in page
    with pytest.raises(SystemExit, match="run with --eval_prompts 40"):
        replicate.heldout_split(argparse.Namespace(split="hard", split_file=str(split), eval_prompts=500))


def test_composed_claim_line_reads_both_parts_claims():
    """ERPO + DPH-RL in one trainer: its line holds only when the Query-KL is below GRPO's AND pass@k is not below."""
    keys = ["greedy", "pass@64", "query_kl"]
    stats = {m: {key: (0.5, 0.01) for key in keys} for m in ["base", "grpo", "composed"]}
    stats["grpo"]["query_kl"] = (0.10, 0.01)
    stats["composed"] |= {"query_kl": (0.01, 0.005), "pass@64": (0.9, 0.01)}
    (line,) = replicate.claims(stats, 64)
    assert line["paper"] == "ERPO + DPH-RL" and line["verdict"] == "holds"
    assert line["labels"]["pass@64"] == ("ERPO + DPH-RL (composed)", "GRPO (TRL)")
    stats["composed"]["pass@64"] = (0.3, 0.01)  # the rehearsal's claim lost: pass@64 below GRPO's
    (line,) = replicate.claims(stats, 64)
    assert line["verdict"] == "does not hold" and line["parts"]["Query-KL lower"] == "holds"


def test_apo_paired_by_seed_is_information_beside_the_verdict():
    per_seed = {"grpo": [{"wall_s": 100.0, "kl_to_base": 2.0}, {"wall_s": 80.0, "kl_to_base": 1.0}],
                "apo": [{"wall_s": 50.0, "kl_to_base": 1.0}, {"wall_s": 60.0, "kl_to_base": 1.5}]}
    text = "\n".join(replicate.paired_lines(per_seed))
    # ratios 0.5 and 0.75: mean 0.625, half-width 12.706 * stdev(0.177) / sqrt(2) = 1.588
    assert "A*-PO's wall time / GRPO's 0.625 ± 1.588 (faster in 2 of 2 seeds)" in text
    assert "A*-PO minus GRPO -0.250 ± 9.529 (lower in 1 of 2 seeds)" in text  # differences -1.0 and +0.5
    assert replicate.paired_lines({"grpo": per_seed["grpo"]}) == []
    assert replicate.paired_lines({"grpo": per_seed["grpo"], "apo": per_seed["apo"][:1]}) == []  # unmatched seeds
    assert replicate.paired_lines({m: rows[:1] for m, rows in per_seed.items()}) == []  # one seed: no interval


def test_level_study_split_and_seed_by_seed_lines():
    """--train_levels / --eval_levels (DPH-RL's shifted-distribution study): the held-out prompts of those levels only,
    the training prompts of the others; pass@j by j and DPH-RL's seed-by-seed lines computed from the records."""
    from trl_variants import load_default_dataset

    ns = argparse.Namespace(split="test", eval_prompts=40, eval_levels=[3, 4], train_levels=[1, 2])
    chosen = replicate.heldout_split(ns)
    full = load_default_dataset(n_train=0, n_test=40)["test"]
    assert list(chosen["prompt"]) == [p for p, lv in zip(full["prompt"], full["level"], strict=True) if lv in (3, 4)]
    assert replicate.run_settings(argparse.Namespace(**vars(ns), steps=1, lr=1.0, G=2, max_len=8, train_prompts=4,
                                                     k=4, temperatures=[1.0], logging_steps=1, threads=1,
                                                     base_model="m", entropy_every=0, lazy_value_pass=False,
                                                     apo_batch=32, apo_shard_size=64))["eval_levels"] == [3, 4]
    assert "levels no training prompt has" in replicate.split_line(ns, 17)
    evals = {"base": [{"temperatures": {"1.0": {"pass@k": {"1": 0.5, "2": 0.7, "4": 1.0}}}}],
             "grpo": [{"temperatures": {"1.0": {"pass@k": {"1": 0.6, "2": 0.7, "4": 0.8}}}},
                      {"temperatures": {"1.0": {"pass@k": {"1": 0.8, "2": 0.9, "4": 1.0}}}}]}
    table = replicate.passk_lines(evals, 4)
    assert table[-2].startswith("| GRPO") and "0.900 ± " in table[-2]  # mean of 0.8 and 1.0 at j = 4
    assert table[-3].split("|")[1:4] == [" base ", " 0.500 ", " 0.700 "]
    per_seed = {"base": [{"pass@4": 1.0}], "grpo": [{"pass@4": 0.8}, {"pass@4": 1.0}, {"pass@4": 0.9}],
                "dph": [{"pass@4": 0.9}, {"pass@4": 0.7}, {"pass@4": 0.9}]}
    text = " ".join(replicate.paired_lines(per_seed, 4))
    assert "below the base's (1.000) in 2 of 3 seeds" in text and "at or above GRPO's in 2 of 3 seeds" in text
