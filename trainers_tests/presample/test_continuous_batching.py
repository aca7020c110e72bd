"""transformers' continuous batching (``use_transformers_continuous_batching``, ``model.generate_batch``) and a static
KV cache (``cache_implementation="static"``) in the offline pass, in evaluation and in the trainers, on the CPU.

transformers 5.24 runs ``generate_batch`` on the CPU (paged attention over SDPA, no CUDA graphs); what it cannot do
there (async batching) or would silently drop (a repetition penalty, history-dependent logits processors) is refused
by name.
"""

import json
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
import transformers
from packaging.version import Version

from trl_variants import accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.generation import eos_token_ids, generate_completions, page_size_name, tokenize_prompts
from trl_variants.presample import PresampleConfig, presample
from trl_variants.presample.config import METADATA_KEY
from trl_variants.presample.runner import HFGenerator
from trl_variants.presample.vllm_backend import trainer_generator

from ..helpers import HAS_CONTINUOUS_BATCHING, needs_continuous_batching, small_config, small_trainer

pytestmark = needs_continuous_batching
PAGE = page_size_name() if HAS_CONTINUOUS_BATCHING else "page_size"  # "block_size" up to 5.17
SMALL_ENGINE = {"num_blocks": 16, PAGE: 32, "max_batch_tokens": 256}  # a cache sized for these tests
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


def test_a_transformers_without_continuous_batching_is_refused_by_name(tmp_path, monkeypatch):
    """Below transformers 5.8 there is no engine: the offline pass, evaluate and every trainer config refuse the
    option naming the version and the ways out, before anything loads (an ImportError of
    ``ContinuousBatchingConfig`` otherwise, from deep inside)."""
    from trl_variants import ERPOConfig
    from trl_variants.evaluation import EvalConfig

    # the module object code imports now (importing TRL's grpo_trainer replaces sys.modules["transformers"])
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.7.0")
    message = r"use_transformers_continuous_batching needs transformers >= 5.8 .*this is transformers 5.7.0"
    with pytest.raises(ValueError, match=message):
        PresampleConfig(num_samples=2, use_transformers_continuous_batching=True)
    with pytest.raises(ValueError, match=message):
        EvalConfig(use_transformers_continuous_batching=True)
    with pytest.raises(ValueError, match="ERPOConfig." + message):
        ERPOConfig(output_dir=str(tmp_path), use_cpu=True, use_transformers_continuous_batching=True)
    PresampleConfig(num_samples=2)  # without the option nothing is asked of transformers


def test_the_page_size_is_read_under_either_name():
    """The cache's page size is ``block_size`` up to transformers 5.17 (the [vllm] extra's) and ``page_size`` from
    5.18 (which still takes ``block_size``): the CPU cache is sized from either; ``page_size`` on 5.17 is refused
    naming the rename."""
    from trl_variants.generation import _cpu_cache_blocks

    # 2 prompts of 10 tokens + 6 new: 2 pages of 8 each, one spare
    for name in ("block_size", "page_size"):
        assert _cpu_cache_blocks({name: 8}, [[1] * 10, [2] * 10], max_new_tokens=6) == {name: 8, "num_blocks": 5}
    if PAGE == "block_size":
        with pytest.raises(ValueError, match=r"this transformers calls page_size block_size: it was renamed in 5\.18"):
            PresampleConfig(num_samples=2, use_transformers_continuous_batching=True,
                            transformers_continuous_batching_config={"page_size": 8})
    else:
        PresampleConfig(num_samples=2, use_transformers_continuous_batching=True,
                        transformers_continuous_batching_config={"page_size": 8})


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
    # (transformers 5.10 drops the request instead of returning its error; 5.17 and 5.24 return it)
    with pytest.raises(RuntimeError, match=r"returned 0 of 2 completions(: No requests can be scheduled| \(the engine "
                                           r"dropped the others; ContinuousBatchingLogger logged why\))"):
        generate_completions(tiny_model, tiny_tokenizer, [[1, 2, 3, 4, 5]], 2, max_new_tokens=8,
                             continuous_batching=True, continuous_batching_config={"num_blocks": 1, PAGE: 4})


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


def _bf16_engine_args(method):
    args = dict(TRAIN_ARGS, bf16=True, **ENGINES["continuous_batching"])
    if method == "apo":
        args["num_generations"] = 1
    if method == "eepo":
        args["capture_stage2_logps"] = False
    return args


def _alternating_reward(completions, **kwargs):  # 0, 1 within every group: each step has advantages to follow
    return [float(i % 2) for i in range(len(completions))]


@pytest.mark.parametrize("method", ["erpo", "eepo", "dph", "apo", "composed"])
def test_bf16_continuous_batching_trains_and_keeps_the_float32_weights(tmp_path, method):
    """With bf16 (Accelerate's autocast around the forward, as on a GPU) continuous batching failed every request,
    and TRL 1.16 casts the float32 policy to bf16 in place before generating (and never back). Each trainer takes a
    step in ``train()``: every completion has tokens, the weights are float32 after it and moved, and the model's
    forward is Accelerate's wrapper again."""
    from trl_variants import ComposedConfig, ComposedTrainer
    from trl_variants.default import DEFAULT_MODEL_PATH

    dataset = load_default_dataset(n_train=4, n_test=1)["train"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "composed":
            args = small_config(ComposedConfig, tmp_path, parts=["erpo_query_weights", "eepo_two_stage_rollout"],
                                **_bf16_engine_args("eepo"))
            trainer = ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=_alternating_reward, args=args,
                                      train_dataset=dataset)
        else:
            trainer = small_trainer(method, tmp_path, dataset=dataset, reward_funcs=_alternating_reward,
                                    **_bf16_engine_args(method))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.state.log_history[0]["completions/min_length"] >= 1
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert "_original_forward" in vars(model) and vars(model)["forward"] is not vars(model)["_original_forward"]


def test_a_request_the_engine_fails_stops_training_naming_the_cache(tmp_path):
    """A KV cache too small for any request: the engine logs its error and returns empty completions, which TRL
    would take on to an IndexError; the trainer stops there, naming the settings to raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = small_trainer("erpo", tmp_path, dataset=load_default_dataset(n_train=4, n_test=1)["train"],
                                **TRAIN_ARGS, use_transformers_continuous_batching=True,
                                transformers_continuous_batching_config={"num_blocks": 1, PAGE: 4,
                                                                         "max_batch_tokens": 8})
        with pytest.raises(RuntimeError, match=r"ERPOTrainer: transformers' continuous batching failed 2 of 2 "
                                               r"requests.*raise num_blocks or max_memory_percent"):
            trainer.train()


def _autocast_wrapped(model):
    """``model`` with its forward wrapped as Accelerate's bf16 wraps it (autocast, outputs converted to float32),
    built from Accelerate's public helper, without an Accelerator (whose process-wide state the trainers own)."""
    from types import MethodType

    from accelerate.utils import convert_outputs_to_fp32

    model._original_forward = model.forward
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    model.forward = MethodType(convert_outputs_to_fp32(autocast(model.forward.__func__)), model)
    return model


@pytest.mark.parametrize("fails", [False, True])
def test_continuous_batching_rollout_puts_back_the_weights_bit_for_bit(fails):
    """The rollout's casts (``model.to(torch.bfloat16)``, then the head back to float32, as TRL's with
    ``cast_lm_head_to_fp32``) reach stand-in parameters only, also when the rollout raises: on exit every parameter,
    gradient and buffer holds its float32 tensor again, the same storage, bit for bit; the forward is the wrapped one
    again and the model is back in its mode."""
    from transformers import AutoModelForCausalLM

    from trl_variants._numerics import weights_kept_in_place
    from trl_variants.default import DEFAULT_MODEL_PATH

    model = _autocast_wrapped(AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32))
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-4)  # values bf16 cannot hold
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-4)
    wrapped = vars(model)["forward"]
    params = {n: (p.detach().clone(), p.data_ptr(), p.grad.clone()) for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    head = model.get_output_embeddings().weight.detach().clone()  # tied to the embedding in the tiny model
    trainer = SimpleNamespace(use_transformers_continuous_batching=True, is_deepspeed_enabled=False,
                              is_fsdp_enabled=False, model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    with pytest.raises(RuntimeError) if fails else warnings.catch_warnings():
        with weights_kept_in_place(trainer):
            assert vars(model)["forward"] == model._original_forward  # the model's own forward while generating
            model.to(torch.bfloat16)
            model.get_output_embeddings().to(torch.float32)
            model.train()  # as TRL leaves it
            head_now = model.get_output_embeddings().weight
            assert head_now.dtype == torch.float32 and not torch.equal(head_now, head)  # rounded through bf16
            if fails:
                raise RuntimeError("the engine failed")
    assert vars(model)["forward"] is wrapped and not model.training
    for n, p in model.named_parameters():
        value, ptr, grad = params[n]
        assert p.dtype == torch.float32 and p.data_ptr() == ptr and torch.equal(p, value) and torch.equal(p.grad, grad)
    assert all(torch.equal(b, buffers[n]) and b.dtype == buffers[n].dtype for n, b in model.named_buffers())


def test_continuous_batching_rollout_keeps_each_gradient_accumulator():
    """A cast of a parameter's data to another dtype and back drops its gradient accumulator, where DDP hooks the
    all-reduce of that gradient: after a bf16 rollout each process would train its own replica, silently
    (trainers_tests/distributed/test_continuous_batching.py runs that on two ranks). The rollout's casts leave every
    parameter's accumulator, and a hook on it, in place: the next backward runs each hook once."""
    from transformers import AutoModelForCausalLM

    from trl_variants._numerics import weights_kept_in_place
    from trl_variants.default import DEFAULT_MODEL_PATH

    model = _autocast_wrapped(AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32))
    params = list(model.parameters())
    fired = []
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in params]  # as DDP's reducer finds them
    for i, acc in enumerate(accumulators):
        acc.register_hook(lambda grad_in, grad_out, i=i: fired.append(i))
    trainer = SimpleNamespace(use_transformers_continuous_batching=True, is_deepspeed_enabled=False,
                              is_fsdp_enabled=False, model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    with weights_kept_in_place(trainer):
        model.to(torch.bfloat16)  # TRL's casts before generate_batch
        model.get_output_embeddings().to(torch.float32)
    sum(p.float().sum() for p in model.parameters()).backward()
    assert sorted(fired) == list(range(len(params)))


def test_generate_batch_runs_on_a_model_prepared_for_bf16(tiny_tokenizer):
    """The offline pass and evaluation during training generate from the trainer's model, which Accelerate's bf16
    wraps in autocast: continuous batching runs it with the model's own forward (the weights' dtype throughout),
    giving the completions of the unprepared model."""
    from transformers import AutoModelForCausalLM

    from trl_variants.default import DEFAULT_MODEL_PATH

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32)
    ids = _prompts(tiny_tokenizer, 2)
    greedy = dict(max_new_tokens=8, do_sample=False, continuous_batching=True, continuous_batching_config=SMALL_ENGINE)
    plain = generate_completions(model, tiny_tokenizer, ids, 1, **greedy)
    prepared = _autocast_wrapped(model)
    assert generate_completions(prepared, tiny_tokenizer, ids, 1, **greedy) == plain


@pytest.mark.skipif(Version(transformers.__version__) < Version("5.24"),
                    reason="TRL 1.16's GRPOTrainer trains with bf16 and continuous batching on a CPU under transformers "
                           "5.17, 5.18, 5.20, 5.22 and 5.23: the failure this test watches came with transformers 5.24")
def test_trl_grpo_trainer_fails_bf16_continuous_batching(tmp_path):
    """Why benchmarks/bench_trainers.py --continuous_batching --gpu holds every variant's weights in bf16 with bf16
    off: TRL 1.16's own GRPOTrainer, with bf16 and continuous batching, fails every request under Accelerate's
    autocast wrapper under transformers 5.24 (the GPU machine's and CI's) and stops at an IndexError on the empty
    completions. When this test fails, TRL or transformers has fixed it: drop the note in docs/gpu.md and let the
    benchmark train as the trainers do."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_variants.default import DEFAULT_MODEL_PATH

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", bf16=True,
                      use_transformers_continuous_batching=True,
                      transformers_continuous_batching_config=SMALL_ENGINE, **TRAIN_ARGS)
    trainer = GRPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                          train_dataset=load_default_dataset(n_train=4, n_test=1)["train"])
    with pytest.raises(IndexError):
        trainer.train()


@pytest.mark.parametrize("option", [dict(repetition_penalty=1.1), dict(generation_kwargs={"num_beams": 2})])
def test_trainer_configs_refuse_what_continuous_batching_drops(tmp_path, option):
    from trl_variants import ERPOConfig

    with pytest.raises(ValueError, match="ERPOConfig.use_transformers_continuous_batching"):
        ERPOConfig(output_dir=str(tmp_path), use_cpu=True, use_transformers_continuous_batching=True, **option)


def test_continuous_batching_under_fsdp_with_mixed_precision_is_refused(tmp_path, monkeypatch):
    """Under FSDP the trainers neither keep the float32 weights from TRL's in-place cast nor swap the forward: the
    configs refuse the combination by name, naming the ways to generate instead; without mixed precision it passes."""
    from trl_variants import ERPOConfig

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    common = dict(output_dir=str(tmp_path), use_cpu=True, use_transformers_continuous_batching=True)
    with pytest.raises(ValueError, match=r"ERPOConfig.use_transformers_continuous_batching under FSDP with bf16/fp16 "
                                         r"is refused.*use_vllm: true"):
        ERPOConfig(bf16=True, **common)
    ERPOConfig(bf16=False, **common)


def test_continuous_batching_under_fsdp_with_several_processes_is_refused(tmp_path, monkeypatch):
    """The engine runs its own schedule of forward passes on each process; under FSDP each forward gathers weights
    from every process, so the collectives stop matching. On 2 FSDP2 CPU processes ERPO (float32) stopped inside the
    engine with gloo's "Is there a distributed collective mismatch" (NCCL would hang). One process has no peers."""
    from trl_variants import ERPOConfig
    from trl_variants._config_checks import check_common

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    config = ERPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, use_transformers_continuous_batching=True)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it (the check the config's __post_init__ runs)
    with pytest.raises(ValueError, match=r"ERPOConfig.use_transformers_continuous_batching under FSDP with 2 "
                                         r"processes is refused.*drop use_transformers_continuous_batching"):
        check_common(config)
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    check_common(config)  # DDP: every process holds the whole model, nothing is gathered while generating
