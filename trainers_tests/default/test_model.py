import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset, measure_accuracy


def test_shipped_files_are_small_and_complete():
    files = {p.name: p.stat().st_size for p in Path(DEFAULT_MODEL_PATH).iterdir()}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "build_report.json"):
        assert name in files, name
    assert files["model.safetensors"] < 8_000_000
    config = json.loads((Path(DEFAULT_MODEL_PATH) / "config.json").read_text())
    assert config["model_type"] == "llama"  # not qwen2: AutoTokenizer would swap in a byte-level tokenizer


def test_loads_offline_and_reaches_documented_accuracy_band():
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 1_200_000
    test = load_default_dataset(n_train=0)["test"]
    sampled = measure_accuracy(model, tok, test, do_sample=True, temperature=1.0, seed=0)
    greedy = measure_accuracy(model, tok, test, do_sample=False)
    # the band the RL trainers are designed around (issue 2): 20-60 % sampled, easy level solved, hard level not
    assert 0.20 <= sampled["overall"] <= 0.60, sampled
    assert sampled["level_1"] >= 0.85 and greedy["level_1"] >= 0.9, (sampled, greedy)
    assert sampled["level_4"] <= 0.5, sampled
    # and the numbers documented in build_report.json / README (same seed, one-sample binomial noise allowed)
    report = json.loads((Path(DEFAULT_MODEL_PATH) / "build_report.json").read_text())
    assert abs(greedy["overall"] - report["test_greedy"]["overall"]) <= 0.05
    assert abs(sampled["overall"] - report["test_sampled_T1"]["overall"]) <= 0.08
