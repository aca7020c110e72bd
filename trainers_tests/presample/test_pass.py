import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk

from trl_variants import presample as ps
from trl_variants.default import load_default_dataset
from trl_variants.losses import optimal_value
from trl_variants.presample import PresampleConfig, hf_backend, logprobs, presample
from trl_variants.rewards import accuracy_reward

from ..helpers import run_two_ranks

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path, **kw):
    base = dict(num_samples=4, max_completion_length=40, value_beta=0.5, record_completion_logps=True,
                shard_size=4, cache_dir=str(tmp_path / "cache"), show_progress=False)
    base.update(kw)
    return PresampleConfig(**base)


@pytest.fixture(scope="module")
def prompts():
    return load_default_dataset(n_train=10, n_test=1, seed=3)["train"]


def test_columns_shapes_and_values(tmp_path, prompts, tiny_model, tiny_tokenizer):
    out = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path))
    assert len(out) == len(prompts)
    assert out["prompt"] == prompts["prompt"]  # order kept, original columns kept
    for col in ("ref_prompt_ids", "ref_prompt_logp", "ref_completion_ids", "ref_completions", "ref_rewards",
                "ref_value", "ref_completion_logps"):
        assert col in out.column_names, col
    row = out[0]
    assert len(row["ref_completion_ids"]) == len(row["ref_rewards"]) == len(row["ref_completions"]) == 4
    assert [len(x) for x in row["ref_completion_logps"]] == [len(x) for x in row["ref_completion_ids"]]
    # the prompt tokens are exactly what GRPOTrainer feeds: the chat template with the generation prompt
    assert row["ref_prompt_ids"] == tiny_tokenizer.apply_chat_template(
        row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    # rewards re-scored independently; V_hat from them
    for r in out:
        assert r["ref_rewards"] == accuracy_reward(r["ref_completions"], [r["solution"]] * 4)
        assert r["ref_value"] == pytest.approx(optimal_value(torch.tensor(r["ref_rewards"]), 0.5).item(), abs=1e-6)
    # the shipped model solves some but not all: rewards are not degenerate
    flat = [x for rs in out["ref_rewards"] for x in rs]
    assert 0 < sum(flat) < len(flat)
    assert ps.summarize(out)["frac_all_wrong"] < 1.0


def test_completion_logps_equal_fresh_forward_of_the_reference(tmp_path, prompts, tiny_model, tiny_tokenizer):
    out = presample(tiny_model, tiny_tokenizer, prompts.select(range(3)), accuracy_reward,
                    _config(tmp_path, temperature=0.7))
    for row in out:
        for comp, stored in zip(row["ref_completion_ids"], row["ref_completion_logps"], strict=True):
            ids = torch.tensor([row["ref_prompt_ids"] + comp])
            with torch.no_grad():
                logits = tiny_model(input_ids=ids).logits[0, :-1] / 0.7
            fresh = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)[-len(comp):]
            torch.testing.assert_close(torch.tensor(stored), fresh, atol=1e-5, rtol=1e-5)
        fresh_prompt = torch.log_softmax(tiny_model(input_ids=torch.tensor([row["ref_prompt_ids"]])).logits[0, :-1], -1)
        ids = torch.tensor(row["ref_prompt_ids"][1:])
        at_t1 = fresh_prompt.gather(-1, ids[:, None]).sum()
        # prompt logp is at the sampling temperature too
        fresh_t = torch.log_softmax(tiny_model(input_ids=torch.tensor([row["ref_prompt_ids"]])).logits[0, :-1] / 0.7,
                                    -1).gather(-1, ids[:, None]).sum()
        assert row["ref_prompt_logp"] == pytest.approx(fresh_t.item(), abs=1e-4)
        assert at_t1.item() != pytest.approx(fresh_t.item(), abs=1e-3)


def test_cache_hit_generates_nothing(tmp_path, prompts, tiny_model, tiny_tokenizer, monkeypatch):
    first = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path))

    def boom(*a, **k):
        raise AssertionError("generation ran on a cache hit")

    monkeypatch.setattr(hf_backend, "generate_completions", boom)
    monkeypatch.setattr(logprobs, "token_logps", boom)
    second = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path))
    assert second.to_dict() == first.to_dict()
    # any option that changes the result changes the key: a miss, not a wrong hit
    with pytest.raises(AssertionError, match="cache hit"):
        presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path, temperature=0.9))


def test_interrupted_run_resumes_to_identical_dataset(tmp_path, prompts, tiny_model, tiny_tokenizer,
                                                      monkeypatch):
    reference = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path / "a"))
    calls = {"n": 0}

    def crashing_reward(completions, solution, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated crash in the second shard")
        return accuracy_reward(completions, solution)

    crashing_reward.__name__ = "accuracy_reward"  # same cache key as accuracy_reward
    crashing_reward.__module__ = accuracy_reward.__module__
    cfg = _config(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):
        presample(tiny_model, tiny_tokenizer, prompts, crashing_reward, cfg)
    run_dir = next(Path(cfg.cache_dir).iterdir())
    assert sorted(p.name for p in run_dir.glob("shard-*.json")) == ["shard-000000.json"]
    assert not (run_dir / "dataset").exists()
    # a half-written shard (crash during a non-atomic write) is never trusted
    (run_dir / "shard-000001.json").write_text('{"shard": 1, "rows": [{"ref_prompt')
    resumed_calls = {"n": 0}

    def counting_reward(completions, solution, **kw):
        resumed_calls["n"] += 1
        return accuracy_reward(completions, solution)

    generated = []
    real_generate = hf_backend.generate_completions

    def counting_generate(model, tokenizer, prompt_ids, *args, **kwargs):
        generated.append(len(prompt_ids))
        return real_generate(model, tokenizer, prompt_ids, *args, **kwargs)

    counting_reward.__name__, counting_reward.__module__ = "accuracy_reward", accuracy_reward.__module__
    monkeypatch.setattr(hf_backend, "generate_completions", counting_generate)
    resumed = presample(tiny_model, tiny_tokenizer, prompts, counting_reward, cfg)
    assert generated == [4, 2]  # shards 1 and 2 only: shard 0's samples came from disk
    # a local function cannot be fingerprinted (renaming it does not make it accuracy_reward): its rewards are never
    # trusted from disk, so all three shards are scored again (cheap: no generation)
    assert resumed_calls["n"] == 3
    assert resumed.to_dict() == reference.to_dict()


def test_two_processes_equal_one_process(tmp_path, prompts, tiny_model, tiny_tokenizer):
    torch.set_num_threads(1)
    try:
        single = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path, use_cache=False))
    finally:
        torch.set_num_threads(int(os.environ.get("TRL_VARIANTS_TEST_THREADS", "2")))
    script = tmp_path / "run.py"
    script.write_text(f"""
import torch
torch.set_num_threads(1)
from accelerate import PartialState
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.presample import PresampleConfig, presample
from trl_variants.rewards import accuracy_reward
state = PartialState(cpu=True)
assert state.num_processes == 2, state
ds = load_default_dataset(n_train=10, n_test=1, seed=3)["train"]
cfg = PresampleConfig(num_samples=4, max_completion_length=40, value_beta=0.5, record_completion_logps=True,
                      shard_size=4, use_cache=False, show_progress=False)
out = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, cfg, accelerator=state)
out.save_to_disk({str(tmp_path / 'rank')!r} + str(state.process_index))
print("OK")
""")
    run_two_ranks(script, 29517)
    for rank in (0, 1):
        assert load_from_disk(str(tmp_path / f"rank{rank}")).to_dict() == single.to_dict()


def test_a_cache_hit_on_some_processes_only_is_taken_by_none(tmp_path):
    """A cache local to each node (``TRL_VARIANTS_CACHE`` on node-local scratch) can hold the finished pass on one
    process and not on another: the process that found it returned while the other went on to the pass's
    collectives, and the run hung. Every process now recomputes (each from its own cached shards), and all return
    the pass's rows."""
    script = tmp_path / "run.py"
    script.write_text(f"""
import shutil, torch
from pathlib import Path
torch.set_num_threads(1)
from accelerate import PartialState
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.presample import PresampleConfig, presample
from trl_variants.rewards import accuracy_reward
state = PartialState(cpu=True)
rank = state.process_index
cache = Path({str(tmp_path)!r}) / f"cache{{rank}}"  # one cache per process, as on node-local disks
ds = load_default_dataset(n_train=8, n_test=1, seed=3)["train"]
cfg = PresampleConfig(num_samples=2, max_completion_length=16, shard_size=4, cache_dir=str(cache), show_progress=False)
first = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, cfg, accelerator=state)
for final in cache.glob("*/dataset"):  # the finished pass stays in process 0's cache only
    if rank == 1:
        shutil.rmtree(final)
state.wait_for_everyone()
assert any(cache.glob("*/dataset/state.json")) == (rank == 0)
again = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, cfg, accelerator=state)
assert again.to_dict() == first.to_dict()
print("OK")
""")
    run_two_ranks(script, 29519, timeout=180)


def test_errors_before_any_generation(tmp_path, prompts, tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="'prompt' column"):
        presample(tiny_model, tiny_tokenizer, prompts.rename_column("prompt", "question"), accuracy_reward,
                  _config(tmp_path))
    with pytest.raises(ValueError, match="needs the dataset column 'solution'"):
        presample(tiny_model, tiny_tokenizer, prompts.remove_columns("solution"), accuracy_reward, _config(tmp_path))
    with pytest.raises(ValueError, match="num_samples must be >= 0"):
        PresampleConfig(num_samples=-1)
    with pytest.raises(ValueError, match="value_beta"):
        PresampleConfig(value_beta=0.0)
    with pytest.raises(ValueError, match="reward function"):
        presample(tiny_model, tiny_tokenizer, prompts, [], _config(tmp_path))
    done = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path))
    with pytest.raises(ValueError, match="presampled already"):
        presample(tiny_model, tiny_tokenizer, done, accuracy_reward, _config(tmp_path))
    with pytest.raises(ValueError, match="num_samples=4 but the trainer is configured with 8"):
        ps.check_presample_options(done, num_samples=8)
    ps.check_presample_options(done, num_samples=4, value_beta=0.5)


def test_prompt_logps_only_pass(tmp_path, prompts, tiny_model, tiny_tokenizer):
    out = presample(tiny_model, tiny_tokenizer, prompts, [], _config(tmp_path, num_samples=0, value_beta=None,
                                                                     record_completion_logps=False))
    assert "ref_completion_ids" not in out.column_names and all(v < 0 for v in out["ref_prompt_logp"])


def test_cli_writes_dataset(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cli = Path(sys.executable).parent / "trl-variants"
    subprocess.run([str(cli), "presample", "--num_samples", "2", "--max_completion_length", "8",
                    "--embedded_train_size", "6", "--value_beta", "0.5", "--output_dir", str(out),
                    "--cache_dir", str(tmp_path / "c"), "--torch_threads", "1"], check=True, env=env,
                   capture_output=True, timeout=300)
    ds = load_from_disk(str(out))
    assert len(ds) == 6 and len(ds[0]["ref_rewards"]) == 2 and "ref_value" in ds.column_names
    assert json.loads(ds.info.description)["trl_variants_presample"]["options"]["num_samples"] == 2
    card = (out / "README.md").read_text()  # the dataset card that --push_to_hub uploads too
    assert "| `num_samples` | `2` |" in card and "2505.20686" in card and "`ref_value`" in card
