"""The offline pass with vLLM: the generator interface end to end with a fake engine (CPU), the option mapping with
real numbers, the trainers' wiring, and a real-vLLM run where vllm and a GPU are present."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.generation import tokenize_prompts, truncate_after_eos
from trl_variants.presample import PresampleConfig, logprobs, presample, vllm_backend
from trl_variants.presample.config import METADATA_KEY
from trl_variants.presample.vllm_backend import (
    ServerGenerator,
    VLLMGenerator,
    request_seed,
    sampling_kwargs,
    trainer_generator,
)
from trl_variants.rewards import accuracy_reward

from ..helpers import small_trainer, train_dataset

EOS = 2


def canned(tokenizer, solution: str, seed: int, max_tokens: int) -> list[int]:
    """What the fake engine returns for one sample seeded ``seed``: a right or wrong boxed answer (a coin flip from
    the seed), EOS, then junk that the pass must cut, at most ``max_tokens`` tokens (as vLLM's max_tokens)."""
    g = torch.Generator().manual_seed(seed)
    right = bool(torch.randint(2, (1,), generator=g))
    text = f"\\boxed{{{solution if right else solution + '1'}}}"
    junk = torch.randint(3, 90, (3,), generator=g).tolist()
    return (tokenizer(text, add_special_tokens=False)["input_ids"] + [EOS] + junk)[:max_tokens]


class FakeLLM:
    """``vllm.LLM.generate``'s signature and outputs (``RequestOutput.outputs[i].token_ids``); sample ``i`` of a
    request seeded ``s`` is seeded ``s + i``, as vLLM seeds parallel samples. Records every call."""

    def __init__(self, tokenizer, solutions):
        self.tokenizer, self.solutions, self.calls = tokenizer, solutions, []

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None):
        self.calls.append([p["seed"] for p in sampling_params])
        outs = []
        for prompt, params in zip(prompts, sampling_params, strict=True):
            solution = self.solutions[tuple(prompt["prompt_token_ids"])]
            outs.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=[
                SimpleNamespace(index=i, token_ids=canned(self.tokenizer, solution, params["seed"] + i,
                                                          params["max_tokens"]))
                for i in range(params["n"])]))
        return outs


@pytest.fixture(scope="module")
def prompts():
    return load_default_dataset(n_train=6, n_test=1, seed=3)["train"]


def _fake(tokenizer, dataset, prompt_ids=None):
    ids = prompt_ids or tokenize_prompts(tokenizer, dataset["prompt"])
    return FakeLLM(tokenizer, {tuple(p): s for p, s in zip(ids, dataset["solution"], strict=True)})


def _generator(llm, **kw):
    return VLLMGenerator(llm, [EOS], name="vllm-fake", sampling_params=dict, **kw)


def _config(tmp_path, **kw):
    base = dict(num_samples=4, max_completion_length=12, value_beta=0.5, record_completion_logps=True, shard_size=2,
                record_prompt_logp=False,
                cache_dir=str(tmp_path / "cache"), show_progress=False)
    return PresampleConfig(**{**base, **kw})


def _expected(tokenizer, dataset, seed=0, n=4, max_tokens=12):
    return [[truncate_after_eos(canned(tokenizer, sol, request_seed(seed, row, n) + i, max_tokens), [EOS])
             for i in range(n)] for row, sol in enumerate(dataset["solution"])]


def test_fake_vllm_pass_end_to_end(tmp_path, prompts, tiny_model, tiny_tokenizer):
    llm = _fake(tiny_tokenizer, prompts)
    out = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path), generator=_generator(llm))
    # one request per prompt, seeded by its row; a shard (2 prompts) is the unit of a generate call
    assert llm.calls == [[request_seed(0, r, 4) for r in rows] for rows in (range(2), range(2, 4), range(4, 6))]
    assert llm.calls == [[0, 4], [8, 12], [16, 20]]  # (0 * 1_000_003 + row) * 4
    expected = _expected(tiny_tokenizer, prompts)
    assert out["ref_completion_ids"] == expected  # the engine's tokens, cut after the first EOS (EOS kept)
    assert all(c[-1] == EOS for per_prompt in expected for c in per_prompt)
    # everything after generation is the shared path: rewards, V_hat, and log-probs from the transformers model
    for i, row in enumerate(out):
        assert row["ref_completions"] == tiny_tokenizer.batch_decode(row["ref_completion_ids"], skip_special_tokens=True)
        assert row["ref_rewards"] == accuracy_reward(row["ref_completions"], [row["solution"]] * 4)
        v = 0.5 * math.log(sum(math.exp(r / 0.5) for r in row["ref_rewards"]) / 4)
        assert row["ref_value"] == pytest.approx(v, abs=1e-6)
        if i not in (0, len(out) - 1):
            continue  # a fresh forward on the first and the last row
        comp = row["ref_completion_ids"][0]
        ids = torch.tensor([row["ref_prompt_ids"] + comp])
        with torch.no_grad():
            fresh = torch.log_softmax(tiny_model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])
        torch.testing.assert_close(torch.tensor(row["ref_completion_logps"][0]), fresh[-len(comp):, 0], atol=1e-4,
                                   rtol=1e-4)
    flat = [r for rs in out["ref_rewards"] for r in rs]
    assert 0 < sum(flat) < len(flat)
    # throughput in the metadata: every generated token (EOS kept, junk cut) over the generation time
    record = json.loads(out.info.description)[METADATA_KEY]["generation"]
    assert record["backend"] == "vllm-fake"
    assert record["generated_tokens"] == sum(len(c) for per_prompt in expected for c in per_prompt)
    assert record["tokens_per_s"] > 0 and record["generation_seconds"] > 0


def test_cache_key_has_the_backend_and_resume_works(tmp_path, prompts, tiny_model, tiny_tokenizer, monkeypatch):
    cfg = _config(tmp_path, record_completion_logps=False)
    hf = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, cfg)
    llm = _fake(tiny_tokenizer, prompts)
    first = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, cfg, generator=_generator(llm))
    assert len(list(Path(cfg.cache_dir).iterdir())) == 2  # same options, another backend: another cache entry
    assert first["ref_completion_ids"] != hf["ref_completion_ids"]
    # a second call is a cache hit: the engine is not called, nothing is scored
    monkeypatch.setattr(logprobs, "token_logps", lambda *a, **k: pytest.fail("scored on a cache hit"))
    calls = len(llm.calls)
    assert presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, cfg,
                     generator=_generator(llm)).to_dict() == first.to_dict()
    assert len(llm.calls) == calls
    monkeypatch.undo()

    # resume: a crash in shard 1 keeps shard 0; the next call generates shards 1 and 2 only, same result
    cfg = _config(tmp_path / "b", record_completion_logps=False)
    crashing = _fake(tiny_tokenizer, prompts)
    real = crashing.generate

    def crash_in_shard_1(prompts_, sampling_params=None, **kw):
        if len(crashing.calls) == 1:
            raise KeyboardInterrupt("simulated crash in the second shard")
        return real(prompts_, sampling_params=sampling_params, **kw)

    crashing.generate = crash_in_shard_1
    with pytest.raises(KeyboardInterrupt):
        presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, cfg, generator=_generator(crashing))
    run_dir = next(Path(cfg.cache_dir).iterdir())
    assert sorted(p.name for p in run_dir.glob("shard-*.json")) == ["shard-000000.json"]
    finished = []
    resumed = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, cfg,
                        generator=_generator(llm, on_finish=lambda: finished.append(1)))
    assert llm.calls[calls:] == [[request_seed(0, r, 4) for r in rows] for rows in (range(2, 4), range(4, 6))]
    assert finished == [1]
    first_rows = first.remove_columns("ref_presample_info").to_dict()
    assert resumed.remove_columns("ref_presample_info").to_dict() == first_rows


def test_samples_do_not_depend_on_the_layout(tmp_path, prompts, tiny_model, tiny_tokenizer):
    """Per-request seeds: another shard size or batch size gives the same samples (the HF path gives other, equally
    valid ones: generate draws a batch's random numbers together)."""
    kw = dict(record_completion_logps=False, use_cache=False)
    a = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path, **kw),
                  generator=_generator(_fake(tiny_tokenizer, prompts)))
    b = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward,
                  _config(tmp_path, shard_size=3, generation_batch_size=8, **kw),
                  generator=_generator(_fake(tiny_tokenizer, prompts)))
    assert a["ref_completion_ids"] == b["ref_completion_ids"]
    c = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, _config(tmp_path, seed=1, **kw),
                  generator=_generator(_fake(tiny_tokenizer, prompts)))
    assert c["ref_completion_ids"] == _expected(tiny_tokenizer, prompts, seed=1) != a["ref_completion_ids"]


def test_server_generator_one_seeded_request_per_prompt(tmp_path, prompts, tiny_model, tiny_tokenizer):
    llm = _fake(tiny_tokenizer, prompts)

    class FakeClient:  # TRL's VLLMClient.generate signature; the server seeds parallel samples as vLLM does
        model, requests = "tiny", []

        def generate(self, prompts, n, repetition_penalty, temperature, top_p, top_k, min_p, max_tokens, logprobs,
                     generation_kwargs):
            self.requests.append((len(prompts), generation_kwargs["seed"], generation_kwargs["stop_token_ids"]))
            params = dict(n=n, max_tokens=max_tokens, seed=generation_kwargs["seed"])
            out = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=[params])
            return {"completion_ids": [o.token_ids for o in out[0].outputs]}

    client = FakeClient()
    out = presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward,
                    _config(tmp_path, record_completion_logps=False), generator=ServerGenerator(client, [EOS]))
    assert sorted(client.requests) == [(1, request_seed(0, r, 4), [EOS]) for r in range(6)]
    assert out["ref_completion_ids"] == _expected(tiny_tokenizer, prompts)  # the same samples as the colocated engine


def test_option_mapping_with_real_numbers():
    cfg = PresampleConfig(num_samples=8, temperature=0.7, top_p=0.95, top_k=20, min_p=0.05, repetition_penalty=1.1,
                          max_completion_length=3072, generation_kwargs={"presence_penalty": 0.5})
    assert sampling_kwargs(cfg, [2, 7]) == dict(
        n=8, temperature=0.7, top_p=0.95, top_k=20, min_p=0.05, repetition_penalty=1.1, max_tokens=3072,
        stop_token_ids=[2, 7], logprobs=None, presence_penalty=0.5)
    # GRPOConfig's defaults: top_k 0 and min_p 0 are "off" in vLLM >= 0.8 as in transformers (TRL passes them as is)
    off = sampling_kwargs(PresampleConfig(num_samples=2), [2])
    assert (off["top_k"], off["min_p"], off["top_p"], off["repetition_penalty"], off["temperature"]) == (0, 0, 1, 1, 1)
    greedy = sampling_kwargs(PresampleConfig(num_samples=1, greedy=True, temperature=0.6), [2])
    assert greedy["temperature"] == 0.0 and greedy["n"] == 1
    # generation_kwargs override, as TRL's: they are SamplingParams arguments under vLLM
    assert sampling_kwargs(PresampleConfig(generation_kwargs={"max_tokens": 99}), [2])["max_tokens"] == 99
    # every sample has its own seed: (seed * 1_000_003 + row) * N + i, disjoint across rows
    assert request_seed(3, 5, 8) == (3 * 1_000_003 + 5) * 8 == 24_000_112
    seeds = {request_seed(3, r, 8) + i for r in range(100) for i in range(8)}
    assert len(seeds) == 800


@pytest.mark.parametrize("kwargs, named", [
    ({"num_beams": 4, "do_sample": True}, r"\['do_sample', 'num_beams'\] are not vLLM SamplingParams options"),
    ({"typical_p": 0.9}, r"\['typical_p'\]"),
    ({"seed": 1}, "'seed': the pass seeds every request"),
    ({"n": 2}, "'n': the pass asks for num_samples"),
])
def test_refused_options_named_before_the_model_loads(kwargs, named, prompts, tiny_tokenizer):
    llm = FakeLLM(tiny_tokenizer, {})
    with pytest.raises(ValueError, match=named):  # a model path that does not exist: the check comes first
        presample("/nonexistent/model", tiny_tokenizer, prompts, accuracy_reward,
                  PresampleConfig(num_samples=2, generation_kwargs=kwargs, use_cache=False),
                  generator=_generator(llm))
    assert llm.calls == []


def test_use_vllm_flag_and_refusals(tmp_path, prompts, tiny_model, tiny_tokenizer, monkeypatch):
    cfg = PresampleConfig(use_vllm=True, vllm_tensor_parallel_size=4, vllm_gpu_memory_utilization=0.6)
    assert cfg.backend == "vllm"
    # resources, not results: not in the cache key or the recorded options (the backend that runs is keyed)
    assert not {"use_vllm", "vllm_tensor_parallel_size", "vllm_gpu_memory_utilization"} & set(cfg.key_options())
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization must be in"):
        PresampleConfig(vllm_gpu_memory_utilization=1.5)
    monkeypatch.setattr(vllm_backend, "vllm_usable", lambda: False)  # as on this machine, also where vllm runs
    with pytest.raises(RuntimeError, match="needs the vllm package and a CUDA GPU"):
        presample("/nonexistent/model", None, prompts, accuracy_reward, PresampleConfig(use_vllm=True))
    from trl_variants.cli.presample_command import presample_main

    with pytest.raises(RuntimeError, match=r"pip install 'trl-variants\[vllm\]'"):  # before the data loads
        presample_main(["--use_vllm", "--num_samples", "2", "--dataset_name", "/nonexistent/data"])
    with pytest.raises(ValueError, match=r"\['num_beams'\] are not vLLM SamplingParams options"):
        monkeypatch.setattr(vllm_backend, "vllm_usable", lambda: True)
        (tmp_path / "p.yaml").write_text("use_vllm: true\ngeneration_kwargs:\n  num_beams: 2\n")
        presample_main(["--config", str(tmp_path / "p.yaml"), "--dataset_name", "/nonexistent"])
    monkeypatch.setattr(vllm_backend, "vllm_usable", lambda: True)
    with pytest.raises(ValueError, match="needs the model as a path"):  # vLLM would load other weights
        presample(tiny_model, tiny_tokenizer, prompts, accuracy_reward, PresampleConfig(use_vllm=True))


def test_trainer_generator_colocate_and_server():
    events = []
    llm = SimpleNamespace(wake_up=lambda tags: events.append(("wake", tags)),
                          sleep=lambda level: events.append(("sleep", level)))
    engine = SimpleNamespace(mode="colocate", tensor_parallel_size=1, enable_sleep_mode=True, llm=llm,
                             sync_weights=lambda: events.append("sync"))
    tok = SimpleNamespace(eos_token_id=2)
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=engine, processing_class=tok, model=None)
    gen = trainer_generator(trainer)
    assert gen.llm is llm and gen.eos_ids == [2]
    gen.prepare()
    gen.finish()
    assert events == ["sync", ("wake", ["kv_cache"]), ("sleep", 2)]
    assert trainer_generator(SimpleNamespace(use_vllm=False)) is None
    engine.tensor_parallel_size = 2
    with pytest.raises(ValueError, match="vllm_tensor_parallel_size=2"):
        trainer_generator(trainer)
    client = SimpleNamespace(model="m")
    server = SimpleNamespace(mode="server", vllm_client=client, sync_weights=lambda: events.append("push"))
    gen = trainer_generator(SimpleNamespace(use_vllm=True, vllm_generation=server, processing_class=tok, model=None))
    assert isinstance(gen, ServerGenerator) and gen.client is client and gen.name == "vllm-server:m"
    gen.prepare()
    assert events[-1] == "push"


@pytest.mark.parametrize("method", ["apo", "dph"])
def test_trainer_pass_generates_with_its_engine(method, tmp_path, tiny_tokenizer, monkeypatch):
    """A trainer with use_vllm=True: its pass samples with the trainer's engine after pushing the weights into it;
    prompt ids from the trainer's tokenization, rewards and log-probs by the shared path."""
    raw = train_dataset(8)
    monkeypatch.setattr(vllm_backend, "vllm_sampling_params", dict)  # vllm.SamplingParams where vllm is installed
    trainer = small_trainer(method, tmp_path, dataset=raw)
    ids = [list(p) for p in trainer._tokenize_prompts(list(raw["prompt"]))[0]]
    llm, synced = _fake(tiny_tokenizer, raw, ids), []
    trainer.use_vllm = True  # as GRPOTrainer sets them with use_vllm=True, vllm_mode="colocate"
    trainer.vllm_generation = SimpleNamespace(mode="colocate", tensor_parallel_size=1, enable_sleep_mode=False,
                                              llm=llm, sync_weights=lambda: synced.append(1))
    if method == "apo":
        out = trainer._with_values(raw)
    else:
        out = trainer.part("dph_rehearsal")._run_presample(trainer, raw, trainer.args.num_presamples, trainer.args.seed)
    n = 2
    assert synced == [1] and [s for call in llm.calls for s in call] == [request_seed(0, r, n) for r in range(8)]
    assert out["ref_prompt_ids"] == ids
    assert out["ref_completion_ids"] == _expected(tiny_tokenizer, raw, n=n, max_tokens=24)
    assert json.loads(out.info.description)[METADATA_KEY]["generation"]["backend"].startswith("vllm==")


def test_real_vllm_pass(tmp_path, prompts):
    pytest.importorskip("vllm", reason="vllm is not installed (pip install 'trl-variants[vllm]'; needs a CUDA GPU)")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA GPU")
    cfg = dict(num_samples=4, max_completion_length=24, record_completion_logps=True, value_beta=0.5, shard_size=4,
               use_cache=False, show_progress=False, use_vllm=True, vllm_gpu_memory_utilization=0.3)
    out = presample(DEFAULT_MODEL_PATH, None, prompts, accuracy_reward, PresampleConfig(**cfg))
    again = presample(DEFAULT_MODEL_PATH, None, prompts, accuracy_reward, PresampleConfig(**{**cfg, "shard_size": 3}))
    assert out["ref_completion_ids"] == again["ref_completion_ids"]  # per-request seeds, whatever the layout
    assert all(len(c) <= 24 for per_prompt in out["ref_completion_ids"] for c in per_prompt)
    assert all(math.isfinite(x) for row in out["ref_completion_logps"] for c in row for x in c)
    record = json.loads(out.info.description)[METADATA_KEY]["generation"]
    assert record["backend"].startswith("vllm==") and record["tokens_per_s"] > 0
    # greedy decoding: the same tokens as transformers generate, up to rare near-ties
    greedy = dict(cfg, num_samples=1, greedy=True, value_beta=None, record_completion_logps=False)
    v = presample(DEFAULT_MODEL_PATH, None, prompts, accuracy_reward, PresampleConfig(**greedy))
    h = presample(DEFAULT_MODEL_PATH, None, prompts, accuracy_reward, PresampleConfig(**dict(greedy, use_vllm=False)))
    same = sum(a == b for a, b in zip(v["ref_completion_ids"], h["ref_completion_ids"], strict=True))
    assert same >= 0.9 * len(prompts)
