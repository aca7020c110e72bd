"""transformers' continuous batching (``use_transformers_continuous_batching``, ``model.generate_batch``) and a static
KV cache (``cache_implementation="static"``) in the offline pass, in evaluation and in the trainers, on the CPU.

transformers 5.24 runs ``generate_batch`` on the CPU (paged attention over SDPA, no CUDA graphs); what it cannot do
there (async batching) or would silently drop (a repetition penalty, history-dependent logits processors) is refused
by name.
"""

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from trl_variants import accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.generation import eos_token_ids, generate_completions, tokenize_prompts
from trl_variants.presample import PresampleConfig, presample
from trl_variants.presample.config import METADATA_KEY
from trl_variants.presample.runner import HFGenerator
from trl_variants.presample.vllm_backend import trainer_generator

from ..helpers import small_trainer

SMALL_ENGINE = {"num_blocks": 16, "page_size": 32, "max_batch_tokens": 256}  # a cache sized for these tests
ENGINES = {"continuous_batching": dict(use_transformers_continuous_batching=True,
                                       transformers_continuous_batching_config=SMALL_ENGINE),
           "static_cache": dict(cache_implementation="static")}


def _prompts(tokenizer, n=4):
    return tokenize_prompts(tokenizer, load_default_dataset(n_train=n, n_test=1, seed=0)["train"]["prompt"])


def _assert_valid(samples, n_prompts, n, max_new_tokens, eos, vocab):
    """As ``generate`` records them: ``n`` completions per prompt, ids in the vocabulary, cut after the first EOS."""
    assert len(samples) == n_prompts and all(len(s) == n for s in samples)
    for c in (c for s in samples for c in s):
        assert 1 <= len(c) <= max_new_tokens and all(0 <= t < vocab for t in c)
        assert not any(t in eos for t in c[:-1])  # an EOS only as the last token
        assert c[-1] in eos or len(c) == max_new_tokens


def test_generate_batch_on_cpu_records_completions_as_generate(tiny_model, tiny_tokenizer):
    """generate_batch runs on the CPU here. Greedy decoding gives generate's completions exactly; sampled ones
    have generate's format (same count, EOS handling, length limit) and are reproducible from the seed (their random
    stream is not generate's). A static KV cache gives generate's samples with the same seed."""
    ids, eos, vocab = _prompts(tiny_tokenizer, 3), eos_token_ids(tiny_tokenizer, tiny_model), tiny_model.config.vocab_size
    greedy = dict(max_new_tokens=12, do_sample=False)
    plain = generate_completions(tiny_model, tiny_tokenizer, ids, 1, **greedy)
    assert generate_completions(tiny_model, tiny_tokenizer, ids, 1, continuous_batching=True, **greedy) == plain

    def sample(seed, **kw):
        torch.manual_seed(seed)
        return generate_completions(tiny_model, tiny_tokenizer, ids, 3, max_new_tokens=12, temperature=1.5, **kw)

    cb = sample(0, continuous_batching=True, continuous_batching_config=SMALL_ENGINE)
    _assert_valid(cb, len(ids), 3, 12, eos, vocab)
    assert cb == sample(0, continuous_batching=True, continuous_batching_config=SMALL_ENGINE)
    assert sample(0, cache_implementation="static") == sample(0)
    assert tiny_model.training is False  # left in the mode it was in (from_pretrained: eval)


def test_refused_by_name_before_anything_loads(tiny_model, tiny_tokenizer):
    """What continuous batching would drop, or cannot run on a CPU, is refused naming the option and the fix."""
    cb = dict(num_samples=2, use_transformers_continuous_batching=True)
    with pytest.raises(ValueError, match="repetition_penalty=1.2 with use_transformers_continuous_batching"):
        PresampleConfig(repetition_penalty=1.2, **cb)
    with pytest.raises(ValueError, match=r"generation_kwargs \['num_beams'\] with use_transformers_continuous"):
        PresampleConfig(generation_kwargs={"num_beams": 2}, **cb)
    with pytest.raises(ValueError, match="'seed': each call is seeded by the pass"):
        PresampleConfig(transformers_continuous_batching_config={"seed": 3}, **cb)
    with pytest.raises(ValueError, match=r"\['max_batch_tokenz'\] is not a set of transformers"):
        PresampleConfig(transformers_continuous_batching_config={"max_batch_tokenz": 3}, **cb)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use_async_batching=True .* on a CPU"):
            PresampleConfig(transformers_continuous_batching_config={"use_async_batching": True}, **cb)
    with pytest.raises(ValueError, match="cache_implementation are options of transformers generation"):
        PresampleConfig(num_samples=2, use_vllm=True, cache_implementation="static")
    config = PresampleConfig(temperature=1.0, transformers_continuous_batching_config='{"max_batch_tokens": 64}',
                             use_transformers_continuous_batching=True)  # a JSON string from the command line
    assert config.transformers_continuous_batching_config == {"max_batch_tokens": 64}
    with pytest.raises(ValueError, match="repetition_penalty=1.1 with use_transformers_continuous_batching"):
        generate_completions(tiny_model, tiny_tokenizer, [[1, 2]], 1, max_new_tokens=2, repetition_penalty=1.1,
                             continuous_batching=True)
    # a request the engine cannot schedule (the cache holds fewer tokens than one request) is raised, not dropped
    with pytest.raises(RuntimeError, match="returned 0 of 2 completions: No requests can be scheduled"):
        generate_completions(tiny_model, tiny_tokenizer, [[1, 2, 3, 4, 5]], 2, max_new_tokens=8,
                             continuous_batching=True, continuous_batching_config={"num_blocks": 1, "page_size": 4})


@pytest.mark.parametrize("engine", list(ENGINES))
def test_offline_pass(tmp_path, engine):
    """presample with each engine: N completions per prompt with valid ids, the engine named in the metadata and
    in the cache key (another key than generate's), a second call served from the cache."""
    ds = load_default_dataset(n_train=3, n_test=1, seed=0)["train"]
    common = dict(num_samples=2, max_completion_length=8, shard_size=4, record_prompt_logp=False,
                  record_completion_logps=True, show_progress=False, cache_dir=str(tmp_path))
    out = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, PresampleConfig(**common, **ENGINES[engine]))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    _assert_valid(out["ref_completion_ids"], len(ds), 2, 8, [tok.eos_token_id], len(tok))
    assert [len(lp) for lps in out["ref_completion_logps"] for lp in lps] == \
        [len(c) for cs in out["ref_completion_ids"] for c in cs]
    info = json.loads(out.info.description)[METADATA_KEY]
    expected = "hf-continuous-batching" if engine == "continuous_batching" else "hf-cache=static"
    assert info["generation"]["backend"].startswith(expected)
    plain = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, PresampleConfig(**common))
    assert json.loads(plain.info.description)[METADATA_KEY]["cache_key"] != info["cache_key"]
    again = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, PresampleConfig(**common, **ENGINES[engine]))
    assert again["ref_completion_ids"] == out["ref_completion_ids"]
    assert json.loads(again.info.description)[METADATA_KEY]["cache_key"] == info["cache_key"]


def test_trainer_passes_its_engine_to_the_offline_pass():
    """A trainer's options become its offline pass's generator (and its cache key); TRL's training default for the
    engine's memory share applies unless set; a trainer without them keeps the pass's plain generate."""
    def trainer(**args):
        cb = args.pop("use_transformers_continuous_batching", False)
        args = {"cache_implementation": None, "transformers_continuous_batching_config": None, **args}
        return SimpleNamespace(use_vllm=False, use_transformers_continuous_batching=cb, args=SimpleNamespace(**args))

    assert trainer_generator(trainer()) is None
    gen = trainer_generator(trainer(use_transformers_continuous_batching=True,
                                    transformers_continuous_batching_config={"max_batch_tokens": 64}))
    assert isinstance(gen, HFGenerator) and gen.continuous_batching
    assert gen.continuous_batching_config == {"max_memory_percent": 0.5, "max_batch_tokens": 64}
    assert gen.name.startswith("hf-continuous-batching")
    static = trainer_generator(trainer(cache_implementation="static")).bound("model", "tok", PresampleConfig())
    assert (static.name, static.model, static.cache_implementation) == ("hf-cache=static", "model", "static")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_evaluate(engine):
    """evaluate (Python API) with each engine: greedy accuracy equals generate's (greedy completions are the same),
    k samples per prompt at each temperature (a static cache: generate's very samples); the options enter a results
    file's key only when set."""
    from trl_variants.evaluate import EvalConfig, evaluate

    ds = load_default_dataset(n_train=1, n_test=4, seed=0)["test"]
    common = dict(k=2, temperatures=[1.0], max_completion_length=12, compute_entropy=False, show_progress=False)
    config = EvalConfig(**common, **ENGINES[engine])
    res = evaluate(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, config)
    plain = evaluate(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, EvalConfig(**common))
    assert res["greedy"] == plain["greedy"]
    sampled = res["temperatures"]["1.0"]
    assert len(sampled["correct"]) == len(ds) and all(0 <= c <= 2 for c in sampled["correct"])
    assert 1 <= sampled["mean_length"] <= 12
    if engine == "static_cache":  # generate's samples, with the same seeds
        assert sampled == plain["temperatures"]["1.0"]
    assert set(ENGINES[engine]) <= set(config.key_options())
    assert not set(ENGINES[engine]) & set(EvalConfig(**common).key_options())
    with pytest.raises(ValueError, match="are options of transformers generation .* backend='vllm'"):
        EvalConfig(**common, backend="vllm", **ENGINES[engine])


TRAIN_ARGS = dict(max_steps=1, per_device_train_batch_size=2, num_generations=2, max_completion_length=6,
                  logging_steps=1)


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("method", ["erpo", "eepo", "dph", "apo"])
def test_each_trainer_trains_with_the_engine(tmp_path, monkeypatch, method, engine):
    """Each trainer takes a training step with the engine, and its offline pass (DPH-RL's, A*-PO's samples)
    generates with it too."""
    from trl_variants.presample import hf_backend

    offline = []
    real = hf_backend.generate_completions

    def recording(*args, **kwargs):
        offline.append({k: kwargs.get(k) for k in ("continuous_batching", "cache_implementation")})
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_backend, "generate_completions", recording)
    overrides = dict(TRAIN_ARGS, **ENGINES[engine])
    if method == "apo":
        overrides["num_generations"] = 1
    if method == "eepo":
        overrides["capture_stage2_logps"] = None if engine == "static_cache" else False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = small_trainer(method, tmp_path, dataset=load_default_dataset(n_train=4, n_test=1)["train"],
                                **overrides)
        trainer.train()
    assert trainer.state.global_step == 1
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)
    expected = {"continuous_batching": True} if engine == "continuous_batching" else {"cache_implementation": "static"}
    assert offline if method in ("dph", "apo") else not offline  # ERPO's pass only scores prompts; EEPO has none
    assert all(expected.items() <= call.items() for call in offline)


def test_eepo_falls_back_once_with_a_warning_under_continuous_batching(tmp_path):
    """EEPO cannot read stage 2's log-probs from the engine's passes: it says so once, naming the option, and scores
    them in the separate forward; capture_stage2_logps=False chooses that silently; True is refused."""
    from trl_variants import EEPOConfig

    with pytest.warns(UserWarning, match="not read while generating under use_transformers_continuous_batching"):
        eepo = small_trainer("eepo", tmp_path / "default", **TRAIN_ARGS, **ENGINES["continuous_batching"])
    assert [p.capture for p in eepo.parts if p.owns_rollout] == [False]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="EEPO")
        small_trainer("eepo", tmp_path / "off", capture_stage2_logps=False, **TRAIN_ARGS,
                      **ENGINES["continuous_batching"])
        small_trainer("eepo", tmp_path / "never", entropy_gate="never", **TRAIN_ARGS,
                      **ENGINES["continuous_batching"])
    with pytest.raises(ValueError, match="capture_stage2_logps=True with use_transformers_continuous_batching"):
        EEPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, capture_stage2_logps=True,
                   use_transformers_continuous_batching=True)


def test_bf16_continuous_batching_rollout_keeps_the_float32_weights(tmp_path):
    """TRL 1.16's continuous-batching rollout casts the policy to bf16 in place (and never back), rounding the
    float32 weights the optimizer updates at every rollout; the trainers keep them (generation still runs in bf16
    through autocast) and the rollout's samples are valid."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = small_trainer("erpo", tmp_path, dataset=load_default_dataset(n_train=4, n_test=1)["train"],
                                bf16=True, **TRAIN_ARGS, **ENGINES["continuous_batching"])
        trainer.model.train()
        out = trainer._generate_and_score_completions([dict(trainer.train_dataset[i]) for i in (0, 0, 1, 1)])
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert "to" not in vars(trainer.accelerator.unwrap_model(trainer.model))  # the no-op is gone after the rollout
    assert out["completion_ids"].shape[0] == 4


@pytest.mark.parametrize("option", [dict(repetition_penalty=1.1), dict(generation_kwargs={"num_beams": 2})])
def test_trainer_configs_refuse_what_continuous_batching_drops(tmp_path, option):
    from trl_variants import ERPOConfig

    with pytest.raises(ValueError, match="ERPOConfig.use_transformers_continuous_batching"):
        ERPOConfig(output_dir=str(tmp_path), use_cpu=True, use_transformers_continuous_batching=True, **option)
