"""benchmarks/dph_dose.py's reading of its runs (DPH-RL's dose-response), on constructed records: the means and 95%
intervals over seeds per eta and prompt set, the rehearsal loss kept from the log, the page's rows."""

import argparse
import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("dph_dose", ROOT / "benchmarks" / "dph_dose.py")
dose = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dose)


def _sets(pef, train, held):
    return {"pef": {"prompts": 10, "k": 16, "pass@16": pef, "avg@16": pef / 2},
            "train_levels": {"prompts": 20, "k": 16, "pass@16": train, "avg@16": train / 2},
            "heldout_levels": {"prompts": 30, "k": 64, "pass@64": held, "avg@64": held / 2}}


def _records():
    return [{"eta": eta, "seed": seed, "sets": _sets(0.9 + 0.01 * seed + eta / 10, 0.8, 0.5 + 0.1 * seed),
             "rehearsal_loss": [[10, 0.5], [20, 0.1 * seed + eta]] if eta else []}
            for eta in (0.0, 0.2) for seed in (0, 1, 2)]


def test_rehearsal_curve_reads_the_logged_loss():
    history = [{"step": 10, "loss": 1.0, "dph/loss_pef": 0.3}, {"step": 20, "loss": 0.9}, {"step": 30, "dph/loss_pef": 0.1}]
    assert dose.rehearsal_curve(history) == [[10, 0.3], [30, 0.1]]


def test_summary_is_mean_and_t_interval_over_seeds():
    records = _records()
    base = {s: _sets(1.0, 0.7, 0.9) for s in (0, 1, 2)}
    stats = dose.summary(records, base, [0.0, 0.2])
    mean, half = stats["0.2"]["heldout_levels"]["pass@64"]
    values = [0.5, 0.6, 0.7]  # 0.5 + 0.1 * seed
    sd = math.sqrt(sum((v - 0.6) ** 2 for v in values) / 2)
    assert math.isclose(mean, 0.6) and math.isclose(half, 4.3027 * sd / math.sqrt(3), rel_tol=1e-3)  # t(0.975, 2 df), not 1.96
    assert math.isclose(stats["0.2"]["pef"]["pass@16"][0], 0.93)  # 0.9 + 0.01 * mean seed + 0.2 / 10
    assert math.isclose(stats["0.2"]["rehearsal_loss_last"][0], 0.3)  # 0.1 * mean seed + 0.2
    assert stats["0"]["rehearsal_loss_last"] is None  # nothing rehearsed at eta = 0
    assert stats["base"]["train_levels"]["pass@16"] == (0.7, 0.0)


def test_page_has_one_row_per_eta_and_the_base(tmp_path):
    records = _records()
    base = {s: _sets(1.0, 0.7, 0.9) for s in (0, 1, 2)}
    stats = dose.summary(records, base, [0.0, 0.2])
    args = argparse.Namespace(seeds=[0, 1, 2], steps=200, pef_prompts=200)
    dose.write_page(tmp_path, stats, records, [0.0, 0.2], args, {0: 10, 1: 11, 2: 12})
    page = (tmp_path / "README.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| base", "| 0", "| 0.2"]
    assert "0.600 ± " in rows[3] and rows[2].endswith("| - |")
