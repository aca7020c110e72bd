import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset, measure_accuracy
from trl_variants.generation import generate_completions, tokenize_prompts
from trl_variants.rewards import accuracy_reward


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
    assert len(test) == 500  # the held-out split the main job reports on
    sampled = measure_accuracy(model, tok, test, do_sample=True, temperature=1.0, seed=0)
    greedy = measure_accuracy(model, tok, test, do_sample=False)
    # the band the RL trainers are designed around (issue 15): level 1 solved; levels 2-4 partly, with room for RL
    assert 0.35 <= sampled["overall"] <= 0.70 and 0.35 <= greedy["overall"] <= 0.60, (sampled, greedy)
    assert sampled["level_1"] >= 0.9 and greedy["level_1"] >= 0.95, (sampled, greedy)
    assert sampled["level_4"] <= 0.5 and greedy["level_4"] <= 0.4, (sampled, greedy)
    # and exactly the numbers documented in build_report.json / README (same seeds, same machine arithmetic)
    report = json.loads((Path(DEFAULT_MODEL_PATH) / "build_report.json").read_text())
    assert abs(greedy["overall"] - report["test"]["greedy"]["overall"]) <= 0.02
    assert abs(sampled["overall"] - report["test"]["sampled_T1"]["overall"]) <= 0.04
    assert report["train_pass_rates"]["frac_strictly_between_0_and_1"] >= 0.5


def test_base_mixes_a_reliable_direct_answer_with_unreliable_steps():
    """What RL has to learn on the default: the base answers step by step most of the time (greedily, always), but
    its direct answers are right far more often, so most prompts are solved sometimes but not always."""
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    train = load_default_dataset(n_train=64, n_test=1, seed=0)["train"]
    torch.manual_seed(0)
    ids = tokenize_prompts(tok, train["prompt"])
    comps = generate_completions(model, tok, ids, 8, max_new_tokens=64, temperature=1.0, do_sample=True)
    rates, by_style = [], {"steps": [], "direct": []}
    for samples, gold, level in zip(comps, train["solution"], train["level"], strict=True):
        texts = tok.batch_decode(samples, skip_special_tokens=True)
        scores = accuracy_reward(texts, [gold] * len(texts))
        rates.append(sum(scores) / len(scores))
        if level > 1:
            for text, score in zip(texts, scores, strict=True):
                by_style["steps" if " = " in text else "direct"].append(score)
    assert sum(0 < r < 1 for r in rates) / len(rates) >= 0.5
    n_steps, n_direct = len(by_style["steps"]), len(by_style["direct"])
    assert 0.5 <= n_steps / (n_steps + n_direct) <= 0.9, (n_steps, n_direct)
    acc = {k: sum(v) / len(v) for k, v in by_style.items()}
    assert acc["direct"] >= acc["steps"] + 0.25, acc
