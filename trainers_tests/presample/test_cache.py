"""The cache key covers everything that changes a pass's result."""

import importlib
import os
import shutil
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM

from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.presample import PresampleConfig, cache_key, hf_backend, presample, runner
from trl_variants.presample.reward_calls import reward_fingerprint
from trl_variants.rewards import accuracy_reward


def _config(tmp_path, **kw):
    base = dict(num_samples=2, max_completion_length=40, value_beta=0.5, shard_size=4,
                cache_dir=str(tmp_path / "cache"), show_progress=False)
    base.update(kw)
    return PresampleConfig(**base)


@pytest.fixture(scope="module")
def prompts():
    """Three level-1 prompts (the tiny model solves them) and three harder ones."""
    ds = load_default_dataset(n_train=40, n_test=1, seed=5)["train"]
    easy = [i for i, level in enumerate(ds["level"]) if level == 1][:3]
    hard = [i for i, level in enumerate(ds["level"]) if level != 1][:3]
    return ds.select(easy + hard)


def _no_generation(monkeypatch):
    monkeypatch.setattr(hf_backend, "generate_completions",
                        lambda *a, **k: pytest.fail("generation ran: the cache should have answered"))


def _reward_module(tmp_path, body: str, name="my_reward_mod"):
    """A reward function in a module file on disk, so that its source can be edited like a user edits theirs."""
    folder = tmp_path / "mods"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(body)
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


REWARD_V1 = "def my_reward(completions, **kw):\n    return [1.0 for _ in completions]\n"
REWARD_V2 = "def my_reward(completions, **kw):\n    return [0.25 for _ in completions]\n"


def test_edited_reward_function_is_rescored_not_served_stale(tmp_path, prompts, tiny_model, tiny_tokenizer,
                                                             monkeypatch):
    v1 = _reward_module(tmp_path, REWARD_V1).my_reward
    first = presample(tiny_model, tiny_tokenizer, prompts, v1, _config(tmp_path))
    assert {r for rs in first["ref_rewards"] for r in rs} == {1.0}
    v2 = _reward_module(tmp_path, REWARD_V2).my_reward  # same module, same name, new code
    assert reward_fingerprint(v1) != reward_fingerprint(v2)
    second = presample(tiny_model, tiny_tokenizer, prompts, v2, _config(tmp_path))
    assert {r for rs in second["ref_rewards"] for r in rs} == {0.25}
    assert second["ref_value"] == pytest.approx([0.25] * len(prompts))
    # the same code again is a hit: nothing is generated
    _no_generation(monkeypatch)
    again = presample(tiny_model, tiny_tokenizer, prompts, _reward_module(tmp_path, REWARD_V2).my_reward,
                      _config(tmp_path))
    assert again["ref_rewards"] == second["ref_rewards"]


REWARD_READING_SETTINGS = """
SETTINGS = {"scale": 1.0, "names": {"a", "b"}}
STARTED = %r  # read by nothing: a start time, a counter
def my_reward(completions, **kw):
    return [SETTINGS["scale"] for _ in completions]
"""


def test_module_data_the_reward_reads_keys_the_cache_and_data_it_does_not_read_does_not(
        tmp_path, prompts, tiny_model, tiny_tokenizer):
    """A settings dict edited between two runs made A*-PO's and DPH-RL's pass serve the first run's rewards (the key
    held the module's code and its immutable constants only); a start time in the same module gave every run
    another key, so a resumed run sampled its pass again."""
    module = _reward_module(tmp_path, REWARD_READING_SETTINGS % 1.0)
    first_key = reward_fingerprint(module.my_reward)
    first = presample(tiny_model, tiny_tokenizer, prompts, module.my_reward, _config(tmp_path))
    assert {r for rs in first["ref_rewards"] for r in rs} == {1.0}
    module.SETTINGS["scale"] = 0.5
    assert reward_fingerprint(module.my_reward) not in (None, first_key)
    second = presample(tiny_model, tiny_tokenizer, prompts, module.my_reward, _config(tmp_path))
    assert {r for rs in second["ref_rewards"] for r in rs} == {0.5}
    restarted = _reward_module(tmp_path, REWARD_READING_SETTINGS % 2.0)  # another start time, same settings
    assert reward_fingerprint(restarted.my_reward) == first_key
    restarted.SETTINGS["scale"] = print  # not plain data: no key, the pass re-scores
    assert reward_fingerprint(restarted.my_reward) is None


REWARD_READING_A_SET_AND_A_LONG_PATTERN = """
import re
NAMES = frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"})
PATTERN = re.compile("x" * 250 + %r)
def my_reward(completions, **kw):
    return [float(bool(PATTERN.search(str(c))) or str(c) in NAMES) for c in completions]
"""


def _fingerprint_in_a_new_interpreter(folder, hash_seed: str) -> str:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import set_reward_mod; "
            "from trl_variants.presample.reward_calls import reward_fingerprint; "
            "print(reward_fingerprint(set_reward_mod.my_reward))")
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONHASHSEED=hash_seed))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_the_key_of_a_reward_reading_a_set_or_a_long_pattern_is_stable_and_sees_the_pattern(tmp_path):
    """A frozenset of strings printed in the order of the interpreter's hash seed (two identical runs, two keys: a
    shared cache never hit), and a compiled pattern's repr stops at 200 characters (a change after them kept the
    key: the old rewards were served)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "set_reward_mod.py").write_text(REWARD_READING_A_SET_AND_A_LONG_PATTERN % "A")
    first, second = (_fingerprint_in_a_new_interpreter(folder, seed) for seed in ("1", "2"))
    assert first == second and first != "None"
    a, b = (reward_fingerprint(_reward_module(tmp_path, REWARD_READING_A_SET_AND_A_LONG_PATTERN % end).my_reward)
            for end in ("A", "B"))  # the patterns differ after 250 characters
    assert None not in (a, b) and a != b


def test_unfingerprintable_reward_reuses_samples_and_rescores(tmp_path, prompts, tiny_model, tiny_tokenizer,
                                                              monkeypatch):
    scale = {"value": 1.0}

    def closure_reward(completions, solution, **kw):  # a closure: its behaviour depends on state outside its code
        return [scale["value"] * r for r in accuracy_reward(completions, solution)]

    assert reward_fingerprint(closure_reward) is None and reward_fingerprint(lambda c, **k: c) is None
    assert reward_fingerprint(accuracy_reward) is not None
    first = presample(tiny_model, tiny_tokenizer, prompts, closure_reward, _config(tmp_path))
    assert any(r == 1.0 for rs in first["ref_rewards"] for r in rs)
    scale["value"] = 3.0
    _no_generation(monkeypatch)  # the samples come from the cache...
    second = presample(tiny_model, tiny_tokenizer, prompts, closure_reward, _config(tmp_path))
    assert second["ref_completion_ids"] == first["ref_completion_ids"]
    # ...and the rewards are computed again, by the function as it is now
    assert second["ref_rewards"] == [[3.0 * r for r in rs] for rs in first["ref_rewards"]]


def test_edited_model_config_is_a_miss(tmp_path, prompts, tiny_tokenizer):
    """config.json edited in place (same weights, same path): other log-likelihoods, so another key."""
    folder = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_PATH, folder)
    config = _config(tmp_path, num_samples=0, value_beta=None)
    model = AutoModelForCausalLM.from_pretrained(folder)
    before = presample(model, tiny_tokenizer, prompts, [], config)
    text = (folder / "config.json").read_text()
    assert '"rope_theta": 10000.0' in text
    (folder / "config.json").write_text(text.replace('"rope_theta": 10000.0', '"rope_theta": 123.0'))
    edited = AutoModelForCausalLM.from_pretrained(folder)
    assert edited.config.rope_parameters["rope_theta"] == 123.0
    assert cache_key(model, tiny_tokenizer, prompts, config) != cache_key(edited, tiny_tokenizer, prompts, config)
    after = presample(edited, tiny_tokenizer, prompts, [], config)
    assert after["ref_prompt_logp"] != pytest.approx(before["ref_prompt_logp"], abs=1e-3)


def test_an_eos_id_and_a_list_of_it_are_one_key(prompts, tiny_tokenizer):
    """transformers up to 5.17 turns the policy's ``eos_token_id`` 2 into [2] when ``train()`` starts; the same
    stopping rule must keep the key (A*-PO's lazy stage 1 resampled cached shards on a resume otherwise), while
    another end-of-sequence id is another key."""
    config = PresampleConfig(num_samples=2, value_beta=0.5)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
    eos = model.generation_config.eos_token_id
    assert isinstance(eos, int)
    key = cache_key(model, tiny_tokenizer, prompts, config)
    model.generation_config.eos_token_id = [eos]
    assert cache_key(model, tiny_tokenizer, prompts, config) == key
    assert model.generation_config.eos_token_id == [eos]  # the model's own config is left as it was
    model.generation_config.eos_token_id = [eos, eos + 1]
    assert cache_key(model, tiny_tokenizer, prompts, config) != key


def test_layout_and_tokenization_are_in_the_key(prompts, tiny_model, tiny_tokenizer):
    """Samples depend on the generation batch (one RNG draw per batch): a pass cached with one layout must not be
    served to a run with another. The prompt ids (chat template, its kwargs) are in the key too."""
    base = PresampleConfig(num_samples=2, value_beta=0.5)
    key = cache_key(tiny_model, tiny_tokenizer, prompts, base, [accuracy_reward], [1.0])
    for other in (dict(generation_batch_size=32), dict(logprob_batch_size=4), dict(shard_size=8),
                  dict(min_p=0.1), dict(repetition_penalty=1.1), dict(generation_kwargs={"top_a": 1})):
        changed = PresampleConfig(num_samples=2, value_beta=0.5, **other)
        assert cache_key(tiny_model, tiny_tokenizer, prompts, changed, [accuracy_reward], [1.0]) != key, other
    ids = [[1, 2, 3]] * len(prompts)
    assert cache_key(tiny_model, tiny_tokenizer, prompts, base, [accuracy_reward], [1.0], prompt_ids=ids) != \
        cache_key(tiny_model, tiny_tokenizer, prompts, base, [accuracy_reward], [1.0], prompt_ids=[[1, 2]] * 6)
    assert cache_key(tiny_model, tiny_tokenizer, prompts, base, [accuracy_reward], [1.0], backend="vllm") != key


def test_reward_fingerprint_is_stable_once_the_reward_has_run():
    """The key of a cached pass must not change because the reward function ran (Python 3.11 specialises running
    bytecode in place, so a hash of ``marshal.dumps(code)`` changed after the first call and a resumed A*-PO run
    sampled its stage 1 again)."""
    before = reward_fingerprint(accuracy_reward)
    for _ in range(3):
        accuracy_reward([f"\\boxed{{{i}}}" for i in range(40)], ["3"] * 40)
    assert reward_fingerprint(accuracy_reward) == before


def test_trainer_checked_reward_is_the_same_cache_entry(tmp_path, prompts, tiny_model, tiny_tokenizer, monkeypatch):
    """The trainers wrap their reward functions (``CheckedReward``): the wrapped function keys the cache,
    so a pass made with the plain function (e.g. by `trl-variants presample`) is a hit for a trainer, not re-scored."""
    from trl_variants._validation import checked_reward_funcs

    checked = checked_reward_funcs(accuracy_reward)
    config = _config(tmp_path)
    assert cache_key(tiny_model, tiny_tokenizer, prompts, config, [checked], [1.0]) == \
        cache_key(tiny_model, tiny_tokenizer, prompts, config, [accuracy_reward], [1.0])
    first = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, config)
    _no_generation(monkeypatch)
    monkeypatch.setattr(runner, "score_shard", lambda *a, **k: pytest.fail("re-scored: the cache should answer"))
    again = presample(tiny_model, tiny_tokenizer, prompts, checked, config)
    assert again["ref_rewards"] == first["ref_rewards"] and again["ref_value"] == first["ref_value"]
