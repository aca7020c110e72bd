import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainers_tests.helpers import small_config, train_dataset
from trl_variants import ERPOConfig, ERPOTrainer, accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.evaluate import (
    EvalConfig,
    HeldOutCallback,
    PassAtKCallback,
    evaluate,
    keep_and_exploration_rates,
    pass_at_k,
    write_report,
)


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 8, 8), (8, 3, 1), (8, 3, 2), (8, 3, 5), (8, 3, 6), (16, 5, 8),
                                   (4, 4, 4), (4, 0, 4), (100, 1, 50)])
def test_pass_at_k_equals_exact_combinatorics(n, c, k):
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 8, 1) == 1.0 and pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)  # pass@1 = c / n
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_keep_and_exploration_rates_hand_built():
    base = [True, True, True, False, False, False, False]
    new = [True, False, True, True, False, False, False]
    r = keep_and_exploration_rates(base, new)
    assert r["keep_rate"] == pytest.approx(2 / 3) and r["exploration_rate"] == pytest.approx(1 / 4)
    assert (r["num_base_solved"], r["num_base_unsolved"]) == (3, 4)
    with pytest.raises(ValueError, match="same prompts"):
        keep_and_exploration_rates([True], [True, False])


def _fake(name, greedy, temps):
    return {"name": name, "greedy": greedy, "config": {"k": 4}, "num_prompts": 2, "temperatures": {
        str(t): {"avg@4": a, "pass@k": {"1": a, "2": min(1, a * 1.5), "4": min(1, a * 2)}, "mean_length": 10.0,
                 "entropy": 0.5, "correct": [1, 2]} for t, a in temps.items()}}


def test_report_files_created_and_non_empty(tmp_path):
    paths = write_report([_fake("a", 0.5, {0.5: 0.4, 1.0: 0.3}), _fake("b", 0.6, {0.5: 0.45, 1.0: 0.2})], tmp_path)
    for key in ("json", "markdown", "temperature_plot", "pass_at_k_plot"):
        assert Path(paths[key]).stat().st_size > 200, key
    assert Path(paths["temperature_plot"]).read_bytes()[:4] == b"\x89PNG"
    assert "| b | 1.0 | 0.600 | 0.200 |" in Path(paths["markdown"]).read_text()


def test_end_to_end_on_the_embedded_model(tmp_path):
    test = load_default_dataset(n_train=0, n_test=24)["test"]
    config = EvalConfig(k=4, temperatures=[0.5, 1.0], max_completion_length=48, seed=3)
    base = evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, name="base")
    again = evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, name="again", base_results=base,
                     reference_model=DEFAULT_MODEL_PATH)
    for res in (base, again):
        assert 0.0 < res["greedy"] < 1.0
        t1 = res["temperatures"]["1.0"]
        assert len(t1["correct"]) == 24 and set(t1["pass@k"]) == {"1", "2", "4"}
        assert t1["pass@k"]["1"] == pytest.approx(t1["avg@4"])  # pass@1 is the mean accuracy
        assert t1["pass@k"]["1"] <= t1["pass@k"]["2"] <= t1["pass@k"]["4"]
        assert t1["entropy"] > res["temperatures"]["0.5"]["entropy"] > 0  # higher temperature, flatter
        assert 10 < t1["mean_length"] <= 48
    # same seed, same model: identical samples, so the model keeps everything and the KL to itself is 0
    assert again["temperatures"]["1.0"]["correct"] == base["temperatures"]["1.0"]["correct"]
    assert again["temperatures"]["1.0"]["keep_rate"] == 1.0 and again["temperatures"]["1.0"]["exploration_rate"] == 0
    assert again["temperatures"]["1.0"]["kl_to_reference"] == pytest.approx(0.0, abs=1e-5)
    paths = write_report([base, again], tmp_path)
    saved = json.loads(Path(paths["json"]).read_text())
    assert saved[1]["temperatures"]["0.5"]["correct"] == again["temperatures"]["0.5"]["correct"]


def test_cli(tmp_path, capsys):
    from trl_variants import cli as cli_module

    out = tmp_path / "eval"
    cli = Path(sys.executable).parent / "trl-variants"
    argv = ["evaluate", "--max_prompts", "12", "--k", "2", "--temperatures", "1.0", "--max_completion_length", "40",
            "--output_dir", str(out)]
    proc = subprocess.run([str(cli), *argv, "--torch_threads", "1"], env=dict(os.environ, HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name for p in out.iterdir()} >= {"results.json", "results.md", "accuracy_vs_temperature.png",
                                                "pass_at_k.png", "chunks"}
    assert "24/24" in proc.stderr  # the progress bar: 12 prompts, greedy and one temperature
    name = Path(DEFAULT_MODEL_PATH).name
    assert [p.name for p in (out / "chunks").iterdir()] == [f"{name}.jsonl"]
    first = json.loads((out / "results.json").read_text())
    cli_module.main(argv)  # the same command again: every chunk is read back, nothing is sampled
    assert f"evaluate {name}: 2 of 2 chunks read back" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == first
    with pytest.raises(ValueError, match=r"another evaluation \(k: 2 in the file, 3 now\)"):
        cli_module.main([*argv[:4], "3", *argv[5:]])


def test_training_callback_logs_metrics(tmp_path):
    trainer = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                          args=small_config(ERPOConfig, tmp_path, max_steps=2), train_dataset=train_dataset())
    test = load_default_dataset(n_train=0, n_test=8)["test"]
    trainer.add_callback(PassAtKCallback(trainer, test, EvalConfig(k=2, temperatures=[1.0], max_completion_length=32),
                                         eval_steps=2))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval_passk/T1.0/pass@2" in h]
    assert len(logged) == 1 and 0 <= logged[0]["eval_passk/greedy"] <= 1


# ------------------------------------------------------------------------------------------- progress bars ---
def test_evaluate_shows_a_progress_bar_with_the_total(capsys):
    test = load_default_dataset(n_train=0, n_test=6)["test"]
    config = EvalConfig(k=2, temperatures=[1.0], max_completion_length=8, compute_entropy=False, chunk_size=4)
    evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, name="tiny")
    err = capsys.readouterr().err
    assert "evaluate tiny" in err and "12/12" in err and "prompt/s" in err  # greedy + 1 temperature, 6 prompts each
    evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, replace(config, show_progress=False), name="tiny")
    assert "evaluate tiny" not in capsys.readouterr().err


def test_heldout_callback_shows_a_bar_unless_disable_tqdm(tmp_path, capsys):
    args = small_config(ERPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=8, disable_tqdm=False)
    trainer = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                          train_dataset=train_dataset(8))
    heldout = load_default_dataset(n_train=0, n_test=4)["test"]
    trainer.add_callback(HeldOutCallback(trainer, heldout, k=2, eval_steps=1, plot=False))
    trainer.train()
    err = capsys.readouterr().err
    assert "held-out step 0" in err and "held-out step 1" in err and "8/8" in err  # greedy + avg@k, 4 prompts each
    trainer.args.disable_tqdm = True
    assert not HeldOutCallback(trainer, heldout, k=2, plot=False).config.show_progress
    assert not PassAtKCallback(trainer, heldout).config.show_progress
    with pytest.raises(ValueError, match="use_vllm=True"):  # the callback's vLLM backend is the trainer's engine
        HeldOutCallback(trainer, heldout, backend="vllm", plot=False)


def test_heldout_evaluation_leaves_training_unchanged(tmp_path):
    """Evaluating samples after seeding torch: before, every measurement reset the random state, so turning held-out
    evaluation on changed the rollouts that followed and the trained weights (by 6e-4 after 3 steps of the CLI's
    tiny recipe). Now it puts the state back: the same weights, bit for bit, with or without it. And its log is an
    entry of its own: before, a measurement at a logging step took that step's rollout metrics and dropped its loss,
    gradient norm and learning rate (transformers cancels a step's pending log after any log)."""
    import torch

    def trained(heldout: bool):
        args = small_config(ERPOConfig, tmp_path / str(heldout), max_steps=2, per_device_train_batch_size=4,
                            num_generations=2, max_completion_length=8)
        trainer = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                              train_dataset=train_dataset(8))
        if heldout:
            trainer.add_callback(HeldOutCallback(trainer, load_default_dataset(n_train=0, n_test=2)["test"], k=2,
                                                 eval_steps=1, plot=False))
        trainer.train()
        return trainer.model.state_dict(), trainer.state.log_history

    plain, plain_log = trained(False)
    evaluated, log = trained(True)
    def kept(entry):  # the offline pass's numbers go to the first log, whichever it is; timings differ
        return {k: v for k, v in entry.items() if not k.startswith("offline_pass/") and k != "step_time"
                and "runtime" not in k and "per_second" not in k}

    assert [h["step"] for h in log if "heldout/greedy" in h] == [0, 1, 2]  # before training and after each step
    assert all(kept(h).keys() == {"heldout/greedy", "heldout/avg@2", "step", "epoch"} for h in log
               if "heldout/greedy" in h)
    steps = [kept(h) for h in log if "heldout/greedy" not in h]  # the training's own entries, each step's whole
    assert steps == [kept(h) for h in plain_log] and len(steps) == 3 and "loss" in steps[1]  # 2 steps, the summary
    assert all(torch.equal(evaluated[k], plain[k]) for k in plain)


# ------------------------------------------------------------------------------------------- vLLM backend ---
def test_backend_vllm_without_vllm_fails_before_loading_anything(monkeypatch, tmp_path):
    import transformers

    from trl_variants import cli
    from trl_variants.cli import evaluate_command
    from trl_variants.presample.vllm_backend import vllm_version

    if vllm_version() is not None:
        pytest.skip("vllm is installed here: the missing-package message cannot be shown")
    fail = lambda *a, **k: pytest.fail("a model or the dataset was loaded before the backend check")  # noqa: E731
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    monkeypatch.setattr(evaluate_command, "load_eval_dataset", fail)
    with pytest.raises(ImportError, match=r"--backend vllm needs the vllm package.*pip install 'trl-variants\[vllm\]'"):
        cli.main(["evaluate", "--backend", "vllm", "--output_dir", str(tmp_path)])
    test = load_default_dataset(n_train=0, n_test=2)["test"]
    with pytest.raises(ImportError, match=r"pip install 'trl-variants\[vllm\]'"):
        evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, EvalConfig(backend="vllm"))
    assert not (tmp_path / "chunks").exists()


def test_engine_is_built_from_grpo_configs_vllm_fields():
    from trl import GRPOConfig

    from trl_variants.presample import PresampleConfig
    from trl_variants.presample.vllm_backend import engine_kwargs

    training = GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False)
    config = EvalConfig(seed=5)
    assert engine_kwargs(config) == dict(
        tensor_parallel_size=training.vllm_tensor_parallel_size,
        gpu_memory_utilization=training.vllm_gpu_memory_utilization,
        max_model_len=training.vllm_max_model_length, model_impl=training.vllm_model_impl, seed=5)
    # the offline pass's engine is unchanged: its config has no vllm_model_impl, vLLM keeps its own default
    assert engine_kwargs(PresampleConfig(seed=5)) == dict(tensor_parallel_size=1, gpu_memory_utilization=0.5,
                                                          max_model_len=None, seed=5)


class FakeLLM:
    """``vllm.LLM.generate``'s signature and outputs. Sample ``i`` of a request seeded ``s`` is the right boxed
    answer when ``s + i`` is even (vLLM seeds parallel sample i with s + i), then EOS and junk to be cut."""

    def __init__(self, tokenizer, solutions):
        self.tokenizer, self.solutions, self.requests = tokenizer, solutions, []

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        outs = []
        for prompt, params in zip(prompts, sampling_params, strict=True):
            self.requests.append(params)
            solution = self.solutions[tuple(prompt["prompt_token_ids"])]
            samples = []
            for i in range(params["n"]):
                answer = solution if (params["seed"] + i) % 2 == 0 else solution + "1"
                ids = self.tokenizer(f"\\boxed{{{answer}}}", add_special_tokens=False)["input_ids"]
                samples.append(SimpleNamespace(token_ids=(ids + [self.tokenizer.eos_token_id, 5, 6])[
                    : params["max_tokens"]]))
            outs.append(SimpleNamespace(outputs=samples))
        return outs


def test_backend_vllm_samples_k_per_prompt_and_scores_as_hf(monkeypatch, tiny_tokenizer):
    """``--backend vllm`` without vLLM: the engine builder replaced by a fake engine. The choice of backend goes
    through one function; each prompt is one request for k samples with the pass's seed, and the samples are scored
    by the same code as the transformers path."""
    from trl_variants.evaluation import runner, sampling
    from trl_variants.generation import tokenize_prompts
    from trl_variants.presample.vllm_backend import VLLMGenerator, request_seed

    test = load_default_dataset(n_train=0, n_test=5)["test"]
    ids = tokenize_prompts(tiny_tokenizer, test["prompt"])
    llm = FakeLLM(tiny_tokenizer, {tuple(p): s for p, s in zip(ids, test["solution"], strict=True)})
    built = []

    def fake_engine(model, tokenizer, config, accelerator=None):
        built.append(config)
        return VLLMGenerator(llm, [tokenizer.eos_token_id], name="vllm-fake", sampling_params=dict)

    monkeypatch.setattr(runner, "check_backend", lambda backend: None)
    monkeypatch.setattr(sampling, "offline_generator", fake_engine)
    config = EvalConfig(k=4, temperatures=[0.7], max_completion_length=12, top_p=0.9, seed=2, chunk_size=2,
                        backend="vllm", show_progress=False)
    res = evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config)
    assert len(built) == 1 and built[0] is config  # one engine for every pass and chunk, built from the config
    greedy, sampled = llm.requests[:5], llm.requests[5:]
    assert all(p["n"] == 1 and p["temperature"] == 0.0 for p in greedy)
    pass_seed = 2 + 700  # EvalConfig.seed + the temperature's offset, as with transformers
    for row, p in enumerate(sampled):
        assert (p["n"], p["temperature"], p["top_p"], p["max_tokens"]) == (4, 0.7, 0.9, 12)
        assert p["seed"] == request_seed(pass_seed, row, 4)
    expected = [sum((request_seed(pass_seed, row, 4) + i) % 2 == 0 for i in range(4)) for row in range(5)]
    entry = res["temperatures"]["0.7"]
    assert entry["correct"] == expected and entry["avg@4"] == sum(expected) / 20
    assert res["greedy"] == sum(request_seed(1000 + 2, row, 1) % 2 == 0 for row in range(5)) / 5
    assert entry["entropy"] > 0 and entry["mean_length"] > 3  # scored by the transformers model, as with hf


def test_backend_vllm_needs_a_model_path(monkeypatch, tiny_model, tiny_tokenizer):
    from trl_variants.evaluation import runner

    monkeypatch.setattr(runner, "check_backend", lambda backend: None)
    test = load_default_dataset(n_train=0, n_test=2)["test"]
    with pytest.raises(ValueError, match="needs the model as a path"):
        evaluate(tiny_model, tiny_tokenizer, test, accuracy_reward, EvalConfig(backend="vllm"))


def test_backend_vllm_with_real_vllm(tmp_path):
    pytest.importorskip("vllm", reason="vllm is not installed here: --backend vllm is tested where it imports "
                                       "(pip install 'trl-variants[vllm]', a CUDA GPU)")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vllm imports but there is no CUDA GPU: --backend vllm runs on GPUs")
    test = load_default_dataset(n_train=0, n_test=8)["test"]
    config = EvalConfig(k=4, temperatures=[1.0], max_completion_length=32, backend="vllm", chunk_size=4,
                        vllm_gpu_memory_utilization=0.3, show_progress=False)
    path = tmp_path / "chunks.jsonl"
    first = evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, results_file=path)
    entry = first["temperatures"]["1.0"]
    assert len(entry["correct"]) == 8 and all(0 <= c <= 4 for c in entry["correct"])
    assert 0 <= first["greedy"] <= 1 and 0 < entry["mean_length"] <= 32
    assert evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, results_file=path) == first
    assert json.loads(path.read_text().splitlines()[0])["key"]["backend"].startswith("vllm==")


def test_cli_refuses_two_models_with_one_name_before_loading(monkeypatch, tmp_path):
    import transformers

    from trl_variants import cli
    from trl_variants.cli import evaluate_command

    fail = lambda *a, **k: pytest.fail("a model or the dataset was loaded before the names were checked")  # noqa: E731
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    monkeypatch.setattr(evaluate_command, "load_eval_dataset", fail)
    with pytest.raises(ValueError, match=r"named \['assets'\].*--model_names"):  # their chunk files would clash
        cli.main(["evaluate", "--models", DEFAULT_MODEL_PATH, DEFAULT_MODEL_PATH, "--output_dir", str(tmp_path)])
