"""`benchmarks/replicate.py`: the statistics behind its claim table, and a reduced replication (1 seed, GRPO only,
a few steps) that must show RL working on the embedded default: the trained model beats the base on held-out data."""

import argparse
import importlib.util
import json
import math
import re
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


GRPO = [0.90, 0.92, 0.95, 0.88, 0.93]  # one number per seed (seeds 0-4)


@pytest.mark.parametrize("a,b,relation,verdict", [
    ([0.80, 0.82, 0.85, 0.78, 0.83], [0.60, 0.62, 0.65, 0.58, 0.63], ">", "holds"),  # intervals apart, right way
    ([0.60, 0.62, 0.65, 0.58, 0.63], [0.80, 0.82, 0.85, 0.78, 0.83], ">", "does not hold"),  # apart, wrong way
    ([0.70, 0.75, 0.80, 0.65, 0.72], [0.65, 0.70, 0.75, 0.70, 0.60], ">", "inconclusive"),  # overlapping
    ([0.10, 0.11, 0.09], [0.30, 0.31, 0.29], "<", "holds"),
    ([0.30, 0.31, 0.29], [0.10, 0.11, 0.09], "<", "does not hold"),
    ([0.9], [0.1, 0.11], ">", "inconclusive"),                   # one seed: no interval, no verdict
    ([0.90, 0.91, 0.92], 0.99, "<", "holds"),                      # against the base: a fixed point (half-width 0)
    ([0.90, 0.99, 0.96], 0.99, "<", "inconclusive"),
])
def test_above_below_parts_read_the_two_intervals(a, b, relation, verdict):
    assert replicate.compare(a, b, relation) == verdict


def test_equal_or_better_is_not_holds_when_intervals_merely_overlap():
    """The old rule passed "equal or better" whenever A's interval was not entirely below B's: overlap = holds."""
    a = [0.55, 0.95, 0.70, 0.90, 0.60]  # mean 0.74 +- 0.21 overlaps GRPO's 0.916 +- 0.034; paired -0.176 +- 0.236
    assert replicate.interval(a)[0] + replicate.interval(a)[1] > replicate.interval(GRPO)[0] - replicate.interval(GRPO)[1]
    assert replicate.compare(a, GRPO, ">=", 0.03) == "inconclusive"
    # A*-PO lazy vs GRPO (results/replication_apo_lazy/): greedy 0.724 +- 0.143 vs 0.918 +- 0.073 printed "holds"
    apo, grpo = [0.802, 0.784, 0.68, 0.814, 0.542], [0.83, 0.968, 0.966, 0.89, 0.936]
    m, h = replicate.paired_difference(apo, grpo)
    assert m == pytest.approx(-0.1936) and h == pytest.approx(0.186, abs=1e-3)  # upper bound -0.008: above -0.03
    assert replicate.compare(apo, grpo, ">=", 0.03) == "inconclusive"
    # the brief's example: clearly worse seed by seed, never "holds"
    a = [0.60, 0.70, 0.80, 0.75, 0.77]
    assert replicate.compare(a, GRPO, ">=", 0.03) == "does not hold"  # paired -0.192 +- 0.086: upper bound < -0.03


def test_equal_or_better_is_non_inferiority_paired_by_seed():
    a = [0.90, 0.91, 0.93, 0.89, 0.92]
    b = [0.91, 0.90, 0.94, 0.90, 0.91]  # differences -0.01, 0.01, -0.01, -0.01, 0.01: -0.002 +- 0.0136
    assert replicate.compare(a, b, ">=", 0.03) == "holds"         # lower bound -0.016 > -0.03
    assert replicate.compare(a, b, ">=", 0.01) == "inconclusive"  # the margin decides: -0.016 < -0.01 < 0.0116
    worse = [x - 0.10 for x in b]
    assert replicate.compare(worse, b, ">=", 0.03) == "does not hold"  # -0.10 exactly every seed: interval -0.10
    # pairing matters: the same numbers, seed order shuffled, are no longer within the margin
    assert replicate.compare([0.60, 0.70, 0.80, 0.90, 1.00], [0.61, 0.71, 0.81, 0.91, 1.01], ">=", 0.03) == "holds"
    assert replicate.compare([0.60, 0.70, 0.80, 0.90, 1.00], [1.01, 0.61, 0.91, 0.71, 0.81], ">=", 0.03) \
        == "inconclusive"
    # lower is better (<=): mirrored around +margin
    assert replicate.compare([1.00, 1.01, 0.99], [1.00, 1.00, 1.00], "<=", 0.03) == "holds"
    assert replicate.compare([1.20, 1.21, 1.19], [1.00, 1.00, 1.00], "<=", 0.03) == "does not hold"
    with pytest.raises(ValueError, match="margin"):
        replicate.compare(a, b, ">=")


def test_unpaired_seeds_give_no_equal_or_better_verdict():
    a = {5: 0.95, 6: 0.96, 7: 0.97}  # far above b, but on other seeds: no pairs, and no unpaired rule
    b = {0: 0.50, 1: 0.51, 2: 0.52}
    assert all(math.isnan(x) for x in replicate.paired_difference(a, b))
    assert replicate.compare(a, b, ">=", 0.03) == "inconclusive"
    assert replicate.compare(a, b, ">") == "holds"  # "above" parts are not paired: they read the two intervals
    # the same seeds, listed in another order, are paired by seed
    assert replicate.compare({1: 0.9, 0: 0.8, 2: 0.7}, {0: 0.8, 1: 0.9, 2: 0.7}, ">=", 0.03) == "holds"
    assert replicate.paired_difference({1: 0.9, 0: 0.8, 2: 0.71}, {0: 0.8, 1: 0.9, 2: 0.7})[0] == pytest.approx(0.01 / 3)
    # a seed without a number is left out of the pairs; fewer than two pairs: no verdict
    assert replicate.compare([0.9, float("nan")], [0.5, 0.5], ">=", 0.03) == "inconclusive"


def test_a_claim_holds_only_when_every_part_does():
    assert replicate.combine(["holds", "holds"]) == "holds"
    assert replicate.combine(["holds", "inconclusive"]) == "inconclusive"
    assert replicate.combine(["inconclusive", "does not hold"]) == "does not hold"


def rows(**columns):
    """Per-seed rows from per-seed lists (seeds 0, 1, 2, ...): rows(greedy=[...], pass@16=[...])."""
    n = len(next(iter(columns.values())))
    return [{key: vals[i] for key, vals in columns.items()} for i in range(n)]


KEYS = ["greedy", "avg@16", "pass@16", "pass@1", "entropy", "kl_to_base", "keep_rate", "query_kl", "wall_s",
        "train_entropy_decay", "eepo_stage1_entropy", "eepo_stage2_entropy"]


def flat(value, n=3):
    return [value - 0.01, value, value + 0.01, value - 0.005, value + 0.005][:n]


def per_seed_of(methods, **overrides):
    """Every number 0.5 +- a little for every method, with ``overrides[method][key]`` per-seed lists."""
    out = {m: rows(**{key: flat(0.5) for key in KEYS}) for m in methods}
    out["base"] = out["base"][:1]
    for method, cols in overrides.items():
        for key, vals in cols.items():
            for row, v in zip(out[method], vals, strict=True):
                row[key] = v
    return out


def test_claim_table_and_headline_figure_from_known_numbers(tmp_path):
    """Made-up per-seed numbers with known verdicts: each paper's line, its parts and the figure's panels."""
    per_seed = per_seed_of(["base", "grpo", "erpo", "eepo", "dph", "apo"], base={"pass@16": [0.9]},
                           grpo={"query_kl": flat(0.10), "pass@16": flat(0.80), "keep_rate": flat(0.90)},
                           erpo={"query_kl": [0.01, 0.011, 0.012], "greedy": flat(0.52)},          # holds
                           eepo={"eepo_stage2_entropy": flat(0.30), "eepo_stage1_entropy": flat(0.31)},  # inconclusive
                           dph={"pass@16": flat(0.70), "keep_rate": flat(0.95)},  # does not hold (pass@16 below)
                           apo={"wall_s": flat(0.4), "kl_to_base": flat(0.2)})    # holds
    lines = {c["paper"]: c for c in replicate.claims(per_seed, 16)}
    assert {p: c["verdict"] for p, c in lines.items()} == {
        "ERPO": "holds", "EEPO": "inconclusive", "DPH-RL": "does not hold", "A*-PO": "holds"}
    assert lines["DPH-RL"]["parts"] == {"pass@16 at or above GRPO": "does not hold",
                                        "keep rate at or above GRPO": "holds", "GRPO's pass@16 below the base's": "holds"}
    assert lines["DPH-RL"]["labels"]["GRPO vs base pass@16"] == ("GRPO (TRL)", "base")
    assert lines["DPH-RL"]["numbers"]["GRPO vs base pass@16"][1] == (0.9, 0.0)  # the base: a fixed point
    assert lines["DPH-RL"]["differences"]["pass@16"] == (pytest.approx(-0.10), pytest.approx(0.0, abs=1e-12))
    assert lines["ERPO"]["rules"] == {"Query-KL lower": replicate.RULE_APART,
                                      "greedy accuracy equal or better": replicate.RULE_NON_INFERIOR}
    for c in lines.values():  # the figure pairs panel i with part i
        assert len(c["numbers"]) == len(c["parts"]) == len(c["labels"])
    replicate.plot_claims(list(lines.values()), tmp_path / "claims.png")
    assert (tmp_path / "claims.png").stat().st_size > 20_000



def test_claim_figure_draws_each_seed_of_each_number(tmp_path):
    """Each claim line carries its numbers per seed (what the figure joins, seed by seed); the base is one number."""
    per_seed = per_seed_of(["base", "grpo", "erpo", "dph"], base={"pass@16": [0.9]},
                           grpo={"query_kl": [0.10, 0.12, 0.14], "pass@16": flat(0.80), "keep_rate": flat(0.9)},
                           erpo={"query_kl": [0.01, 0.011, 0.012], "greedy": flat(0.52)},
                           dph={"pass@16": flat(0.70), "keep_rate": flat(0.95)})
    lines = {c["paper"]: c for c in replicate.claims(per_seed, 16)}
    assert lines["ERPO"]["seeds"]["Query-KL"] == [{0: 0.01, 1: 0.011, 2: 0.012}, {0: 0.10, 1: 0.12, 2: 0.14}]
    assert lines["DPH-RL"]["seeds"]["GRPO vs base pass@16"][1] == 0.9
    replicate.plot_claims(list(lines.values()), tmp_path / "claims.png")
    assert (tmp_path / "claims.png").stat().st_size > 20_000

def test_same_seed_same_prompts_and_trainer_seed_for_every_method(monkeypatch, tmp_path):
    """Why "equal or better" parts may pair by seed: train() gives every method of a seed the same training prompts
    and the same trainer seed (GRPOTrainer's RepeatSampler shuffles with it); another seed, other prompts."""
    seen = {}

    class Stop(Exception):
        pass

    def classes(method):
        def trainer(model, reward_funcs, args, train_dataset):
            seen[(method, args["seed"])] = list(train_dataset["prompt"])
            raise Stop

        return trainer, lambda **kw: kw

    monkeypatch.setattr(replicate, "method_classes", classes)
    args = argparse.Namespace(train_prompts=16, eval_prompts=40, logging_steps=1, G=8, max_len=8, lr=1e-4, steps=1,
                              lazy_value_pass=False, apo_batch=32, apo_shard_size=64, base_model="m", entropy_every=0)
    for seed in (5, 6):
        for method in ("grpo", "dph", "apo", "eepo"):
            with pytest.raises(Stop):
                replicate.train(method, seed, args, tmp_path / f"{method}-{seed}")
    for seed in (5, 6):
        assert seen[("dph", seed)] == seen[("apo", seed)] == seen[("eepo", seed)] == seen[("grpo", seed)]
    assert seen[("grpo", 5)] != seen[("grpo", 6)]
    assert replicate.shared_settings(args, 7, tmp_path)["seed"] == 7


def replication_json(tmp_path):
    """A small replication.json as main() writes it (an older one: rows without their seed), A*-PO vs GRPO."""
    apo, grpo = [0.802, 0.784, 0.68, 0.814, 0.542], [0.83, 0.968, 0.966, 0.89, 0.936]  # greedy, A*-PO lazy's
    keys = ["avg@4", "pass@4", "pass@1", "entropy", "keep_rate", "query_kl", "train_entropy_decay",
            "heldout_entropy", "eepo_stage1_entropy", "eepo_stage2_entropy"]
    per_seed = {"base": [{key: 0.5 for key in keys} | {"greedy": 0.5, "kl_to_base": math.nan, "wall_s": 0.0}],
                "grpo": rows(**{key: flat(0.9, 5) for key in keys}, greedy=grpo,
                             kl_to_base=[1.9, 2.0, 1.8, 1.9, 2.1], wall_s=[86.0, 85.0, 88.0, 87.0, 86.0]),
                "apo": rows(**{key: flat(0.8, 5) for key in keys}, greedy=apo, kl_to_base=[2.8, 2.9, 2.7, 2.6, 3.1],
                            wall_s=[176.0, 175.0, 178.0, 177.0, 176.0])}
    ev = {"num_prompts": 17, "temperatures": {"1.0": {"pass@k": {"1": 0.5, "2": 0.7, "4": 0.9}}}}
    data = {"settings": {"seeds": [0, 1, 2, 3, 4], "steps": 200, "lr": 1e-4, "G": 8, "max_len": 64,
                         "train_prompts": 2000, "methods": ["grpo", "apo"], "eval_prompts": 500, "k": 4,
                         "temperatures": [1.0], "logging_steps": 10, "threads": 2, "out": "o", "work_dir": "w",
                         "base_model": "/x/assets", "apo_batch": 4, "apo_shard_size": 1, "lazy_value_pass": True},
            "command": "/somewhere/benchmarks/replicate.py --methods grpo apo --k 4 --temperatures 1.0",
            "wall_s": 3600.0, "stats": {}, "claims": [{"paper": "A*-PO", "verdict": "stale"}], "per_seed": per_seed,
            "evaluations": {"base": [ev], "grpo": [ev] * 5, "apo": [ev] * 5}, "histories": {"grpo": [], "apo": []}}
    folder = tmp_path / "replication_x"
    folder.mkdir()
    (folder / "replication.json").write_text(json.dumps(data, indent=1))
    return folder, data


def test_rebuild_a_page_from_its_replication_json_alone(tmp_path, monkeypatch):
    """--from_json: README.md and claims.png from replication.json, by today's rules; nothing trained or evaluated."""
    folder, data = replication_json(tmp_path)
    monkeypatch.setattr(replicate, "train", lambda *a, **k: pytest.fail("--from_json trained"))
    (result,) = replicate.main(["--from_json", str(folder / "replication.json")])
    (line,) = result["claims"]
    assert line["parts"] == {"greedy accuracy equal or better": "inconclusive",  # the old rule: holds (overlap)
                             "less wall time (offline pass included)": "does not hold",
                             "lower KL to the base": "does not hold"}
    page = (folder / "README.md").read_text()
    assert "Made by `python benchmarks/replicate.py --methods grpo apo --k 4 --temperatures 1.0` (5 seeds" in page
    assert "total wall time 60 min" in page and "results/claims_protocol.md" in page
    assert "overlapping = inconclusive" not in page and "non-inferiority, paired by seed" in page
    assert "--from_json" in page and "**does not hold** (greedy accuracy equal or better: inconclusive" in page
    assert "greedy: 0.724 ± 0.143 vs 0.918 ± 0.073, paired difference -0.194 ± 0.186" in page
    assert "| A*-PO | 1 | 4 | 0.40 | training + offline pass (stage 1, lazy" in page  # the regime, from the settings
    assert (folder / "claims.png").stat().st_size > 20_000
    stored = json.loads((folder / "replication.json").read_text())
    assert stored["claims"][0]["parts"] == line["parts"]  # the stored verdicts follow the page
    assert {k: v for k, v in stored.items() if k != "claims"} == \
        {k: v for k, v in json.loads(json.dumps(data)).items() if k != "claims"}  # nothing else rewritten

    data["per_seed"]["apo"].pop()  # a row short of the seeds: which seed is which is unknown, refused
    (folder / "replication.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="apo has 4 per-seed rows"):
        replicate.rebuild(folder / "replication.json")
    del data["per_seed"]  # a page from before per-seed numbers were stored (results/replication_previous_default/)
    (folder / "replication.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="no per-seed numbers"):
        replicate.rebuild(folder / "replication.json")


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (ROOT / "results").glob("replication*/replication.json")
                                          if "per_seed" in json.loads(p.read_text())))
def test_committed_pages_print_the_verdicts_of_their_own_numbers(folder):
    """Every results page with per-seed numbers prints the verdicts today's rules give those numbers, and states the
    rule as results/claims_protocol.md does."""
    path = ROOT / "results" / folder / "replication.json"
    data = json.loads(path.read_text())
    per_seed = replicate.with_seeds(data["per_seed"], data["settings"]["seeds"])
    page = (path.parent / "README.md").read_text()
    protocol_link = f"[results/claims_protocol.md]({Path('..', 'claims_protocol.md')})"  # relative to the page
    assert protocol_link in page and "overlapping = inconclusive" not in page
    number = r"(-?[\d.]+)(?: ± ([\d.]+))?"
    for c in replicate.claims(per_seed, data["settings"]["k"]):
        parts = ", ".join(f"{p}: {v}" for p, v in c["parts"].items())
        row = f"| {c['paper']} | {c['claim']} | **{c['verdict']}** ({parts}) | "
        assert row in page
        assert [s["verdict"] for s in data["claims"] if s["paper"] == c["paper"]] == [c["verdict"]]
        printed = page.split(row)[1].split(" |\n")[0].split("; ")  # the numbers column, one cell per part
        for (part, verdict), cell in zip(c["parts"].items(), printed, strict=True):  # each verdict from what is printed
            relation = c["relations"][part]
            m = re.fullmatch(rf".+?: {number} vs {number}(?:, paired difference {number})?", cell)
            a, ha, b, hb, d, hd = (math.nan if x is None else float(x) for x in m.groups())
            if relation in (">=", "<="):
                assert replicate.non_inferior_verdict((d, hd), relation, replicate.MARGIN) == verdict, cell
            else:
                assert replicate.apart_verdict((a, ha), (b, 0.0 if math.isnan(hb) else hb), relation) == verdict, cell


def test_every_number_table_shows_apart_intervals_apart():
    """The table of every number picks its decimals per column: held-out entropy 0.0725 +- 0.0032 vs 0.0646 +- 0.0043
    needs 4 (at 3 the two intervals touch at 0.069); columns where 3 decimals keep every pair as it is stay at 3."""
    assert replicate.column_digits([(0.0725, 0.0032), (0.0646, 0.0043), (0.085, 0.0)]) == 4
    assert replicate.column_digits([(0.70, 0.10), (0.65, 0.10), (0.2, float("nan"))]) == 3
    assert replicate.column_digits([(0.5004, 0.0), (0.4996, 0.0)]) == 4  # 0.500 vs 0.500 would read as equal


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (ROOT / "results").glob("replication*/replication.json")
                                          if "per_seed" in json.loads(p.read_text())))
def test_committed_tables_of_every_number_keep_apart_intervals_apart(folder):
    """In each committed page's table of every number, two intervals read apart as printed exactly when they are
    apart in the page's own per-seed numbers (read back from the printed cells, not recomputed)."""
    path = ROOT / "results" / folder / "replication.json"
    data = json.loads(path.read_text())
    stats = list(replicate.summarize(replicate.with_seeds(data["per_seed"], data["settings"]["seeds"])).values())
    page = (path.parent / "README.md").read_text()
    table = page.split("## Every number")[1].split("\n\n")[1].splitlines()
    cols = [c.strip() for c in table[0].strip("|").split("|")][1:]
    printed = [[c.strip() for c in row.strip("|").split("|")][1:] for row in table[2:]]
    assert len(printed) == len(stats)

    def apart(a, b):
        return replicate.apart_verdict(a, b, ">") != "inconclusive"

    for j, col in enumerate(cols):
        shown = [tuple(float(x) for x in cells[j].split(" ± ")) for cells in printed]
        exact = [s[col] for s in stats]
        for a in range(len(stats)):
            for b in range(a + 1, len(stats)):
                if any(math.isnan(v) for v in (*exact[a], *exact[b])):
                    continue
                assert apart(shown[a], shown[b]) == apart(exact[a], exact[b]), (folder, col, shown[a], shown[b])


def test_numbers_are_printed_with_the_decimals_their_verdict_needs():
    """Held-out entropy 0.0725 +- 0.0032 vs 0.0646 +- 0.0043 (results/replication_narrow_eepo/): apart by 0.0004, which
    three decimals (0.072 +- 0.003 vs 0.065 +- 0.004) would print as touching."""
    assert replicate.shown_digits("holds", ">", (0.0725, 0.0032), (0.0646, 0.0043)) == 4
    assert replicate.shown_digits("inconclusive", ">", (0.70, 0.10), (0.65, 0.10)) == 3
    assert replicate.shown_digits("holds", ">=", (0, 0), (0, 0), diff=(-0.0005, 0.0294)) == 4  # lower bound -0.0299


@pytest.mark.slow
def test_reduced_replication_grpo_beats_the_base(tmp_path, monkeypatch):
    out = tmp_path / "replication"
    argv = ["--seeds", "0", "--methods", "grpo", "--steps", "30", "--train_prompts", "256", "--eval_prompts", "100",
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
    per_seed = per_seed_of(["base", "grpo", "eepo"], eepo={"heldout_entropy": flat(0.30), "train_entropy_decay":
                                                           flat(0.9)},  # rollouts: decays faster
                           grpo={"heldout_entropy": flat(0.20)})
    (line,) = replicate.claims(per_seed, 16)
    assert line["parts"]["entropy decays slower"] == "holds"
    (eepo, grpo) = line["numbers"]["held-out entropy across training (T = 1)"]
    assert eepo[0] == pytest.approx(0.30) and grpo[0] == pytest.approx(0.20)
    for row in per_seed["grpo"]:  # not measured: the rollouts' decay (0.9 vs 0.5)
        row["heldout_entropy"] = math.nan
    (line,) = replicate.claims(per_seed, 16)
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
    per_seed = per_seed_of(["base", "grpo", "composed"], grpo={"query_kl": flat(0.10), "pass@64": flat(0.9)},
                           composed={"query_kl": [0.01, 0.011, 0.012], "pass@64": [0.91, 0.90, 0.92]})
    (line,) = replicate.claims(per_seed, 64)
    assert line["paper"] == "ERPO + DPH-RL" and line["verdict"] == "holds"
    assert line["labels"]["pass@64"] == ("ERPO + DPH-RL (composed)", "GRPO (TRL)")
    for row in per_seed["composed"]:  # the rehearsal's claim lost: pass@64 below GRPO's
        row["pass@64"] = 0.3
    (line,) = replicate.claims(per_seed, 64)
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
