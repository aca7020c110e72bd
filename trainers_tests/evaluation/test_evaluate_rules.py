"""``trl-variants evaluate``'s rules: correctness comes from one named reward function (the others are reported
beside it, never summed in), the models go to the accelerator (and the device is printed), and a training recipe
can be evaluated with ``--config`` (its model, data, prompt and sampling settings; training-only keys ignored),
here on a local stand-in of MATH-500."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import trl_variants.evaluation as ev
from trl_variants import accuracy_reward
from trl_variants.cli import evaluate_command
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.evaluate import EvalConfig, correctness_index, evaluate
from trl_variants.evaluation import runner, sampling
from trl_variants.rewards import format_reward

from ..helpers import needs_continuous_batching

ROOT = Path(__file__).resolve().parents[2]


def minus_one_reward(completions, **kwargs):  # a penalty: every sample gets -1
    return [-1.0] * len(completions)


# ------------------------------------------------------------------------------------ one correctness rule ---
def test_other_rewards_never_change_correctness():
    """With format_reward beside accuracy_reward the tiny model's numbers were 1.000 (the summed reward > 0 for
    every well-formatted wrong answer); correctness is accuracy_reward's alone, whatever else is reported."""
    data = load_default_dataset(n_train=0, n_test=16)["test"]
    config = EvalConfig(k=2, temperatures=[1.0], max_completion_length=64, compute_entropy=False, show_progress=False)
    alone = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config)
    for funcs in ([accuracy_reward, format_reward], [format_reward, accuracy_reward],
                  [minus_one_reward, accuracy_reward]):
        res = evaluate(DEFAULT_MODEL_PATH, None, data, funcs, config)
        assert res["greedy"] == alone["greedy"] < 1.0
        assert res["temperatures"]["1.0"]["avg@2"] == alone["temperatures"]["1.0"]["avg@2"]
        assert res["temperatures"]["1.0"]["correct"] == alone["temperatures"]["1.0"]["correct"]
        assert res["correctness_func"] == "accuracy_reward"
        # every function's mean is reported beside it
        assert res["greedy_reward_means"]["accuracy_reward"] == pytest.approx(alone["greedy"])
        assert set(res["temperatures"]["1.0"]["reward_means"]) == {f.__name__ for f in funcs}
    assert res["greedy_reward_means"]["minus_one_reward"] == -1.0
    # another function named: its values decide (format_reward is 0/1, so greedy accuracy = its mean)
    fmt = evaluate(DEFAULT_MODEL_PATH, None, data, [accuracy_reward, format_reward], config,
                   correctness_func="format_reward")
    assert fmt["correctness_func"] == "format_reward" and fmt["greedy"] == fmt["greedy_reward_means"]["format_reward"]


def test_correctness_function_choice_and_refusals():
    from trl_variants.presample.reward_calls import RewardModelReward

    assert correctness_index([format_reward, accuracy_reward]) == 1  # accuracy_reward by default
    assert correctness_index([format_reward]) == 0  # the only function
    assert correctness_index([accuracy_reward, format_reward], "format_reward") == 1
    assert correctness_index([accuracy_reward, format_reward], format_reward) == 1
    with pytest.raises(ValueError, match=r"none of \['format_reward', 'minus_one_reward'\] is accuracy_reward.*"
                                         r"--correctness_func"):
        correctness_index([format_reward, minus_one_reward])
    with pytest.raises(ValueError, match=r"'nope' names none of the reward functions"):
        correctness_index([accuracy_reward], "nope")
    rm = RewardModelReward.__new__(RewardModelReward)  # only its type matters here
    rm.__name__ = "tiny-rm"
    with pytest.raises(ValueError, match=r"reward model 'tiny-rm'.*--correctness_func reward_model"):
        correctness_index([rm])
    assert correctness_index([rm], rm) == 0  # asked for explicitly


def test_cli_refuses_an_ambiguous_or_missing_correctness_function_before_loading(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="evaluate checks matplotlib first")
    from trl_variants import cli

    monkeypatch.setattr(evaluate_command, "load_eval_dataset", lambda *a, **k: pytest.fail("loaded data before the check"))
    with pytest.raises(ValueError, match=r"none of --reward_funcs \['format_reward', 'trl_variants.rewards"):
        cli.main(["evaluate", "--reward_funcs", "format_reward", "trl_variants.rewards.format_reward",
                  "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"--correctness_func reward_model .* no --reward_model_name_or_path"):
        cli.main(["evaluate", "--correctness_func", "reward_model", "--output_dir", str(tmp_path)])


def test_cli_reward_model_counts_only_when_asked(tmp_path, capsys):
    """A reward model alone is refused; named with --correctness_func reward_model, its score > 0 is correctness;
    beside accuracy_reward, it is only reported."""
    pytest.importorskip("matplotlib", reason="evaluate writes plots")
    from trainers_tests.helpers import tiny_reward_model
    from trl_variants import cli

    rm = tiny_reward_model(tmp_path / "tiny-rm")
    common = ["--max_prompts", "4", "--k", "2", "--temperatures", "1.0", "--max_completion_length", "16",
              "--compute_entropy", "false", "--show_progress", "false"]
    with pytest.raises(ValueError, match=r"--reward_model_name_or_path is not supported by evaluate as the judge"):
        cli.main(["evaluate", "--reward_model_name_or_path", rm, "--output_dir", str(tmp_path / "a"), *common])
    cli.main(["evaluate", "--reward_model_name_or_path", rm, "--correctness_func", "reward_model",
              "--output_dir", str(tmp_path / "b"), *common])
    judged = json.loads((tmp_path / "b" / "results.json").read_text())[0]
    assert judged["correctness_func"] == "tiny-rm"
    cli.main(["evaluate", "--reward_model_name_or_path", rm, "--reward_funcs", "accuracy_reward",
              "--output_dir", str(tmp_path / "c"), *common])
    both = json.loads((tmp_path / "c" / "results.json").read_text())[0]
    assert both["correctness_func"] == "accuracy_reward" and set(both["greedy_reward_means"]) == {"tiny-rm",
                                                                                                   "accuracy_reward"}
    assert both["greedy"] == both["greedy_reward_means"]["accuracy_reward"]


def _strip_correctness_from_header(path: Path) -> None:
    """Make ``path`` look written by the version that summed the rewards (its key had no correctness_func)."""
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    del header["key"]["correctness_func"]
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")


def test_results_file_key_names_the_correctness_function(tmp_path, capsys):
    data = load_default_dataset(n_train=0, n_test=4)["test"]
    config = EvalConfig(k=2, temperatures=[1.0], greedy=False, max_completion_length=12, compute_entropy=False,
                        chunk_size=2, show_progress=False)
    path = tmp_path / "m.jsonl"
    first = evaluate(DEFAULT_MODEL_PATH, None, data, [accuracy_reward, format_reward], config, results_file=path)
    assert json.loads(path.read_text().splitlines()[0])["key"]["correctness_func"][:2] == [0, "accuracy_reward"]
    with pytest.raises(ValueError, match=r"another evaluation \(correctness_func: \[0, \"accuracy_reward\""):
        evaluate(DEFAULT_MODEL_PATH, None, data, [accuracy_reward, format_reward], config, results_file=path,
                 correctness_func="format_reward")
    # a file of the summing version with two functions: its numbers differ, refused naming --restart
    _strip_correctness_from_header(path)
    with pytest.raises(ValueError, match=r"earlier version of evaluate.*sum of all its rewards \(accuracy_reward, "
                                         r"format_reward\).*--restart true"):
        evaluate(DEFAULT_MODEL_PATH, None, data, [accuracy_reward, format_reward], config, results_file=path)
    again = evaluate(DEFAULT_MODEL_PATH, None, data, [accuracy_reward, format_reward], config, results_file=path,
                     restart=True)
    assert again == first
    # ... with accuracy_reward alone the sum was accuracy_reward: the old file is read back, nothing sampled again
    alone = tmp_path / "alone.jsonl"
    plain = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, results_file=alone)
    _strip_correctness_from_header(alone)
    capsys.readouterr()
    assert evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, results_file=alone) == plain
    assert "2 of 2 chunks read back" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- the device ---
class _CudaState:
    """``accelerate.PartialState`` on a one-GPU machine, as far as evaluate asks it."""

    device = torch.device("cuda", 0)
    num_processes, process_index, is_main_process = 1, 0, True

    def __init__(self, *args, **kwargs):
        pass


def _pretend_cuda(monkeypatch) -> list:
    """Accelerate reports a GPU, and moving a model to a CUDA device is recorded instead of done (this machine has
    none): returns the devices models were sent to."""
    import accelerate

    moved, real_to = [], torch.nn.Module.to

    def to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if isinstance(target, str | torch.device) and torch.device(target).type == "cuda":
            moved.append(str(target))
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(accelerate, "PartialState", _CudaState)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    return moved


def test_eval_device_is_the_accelerator_unless_told(monkeypatch):
    assert ev.eval_device() == torch.device("cpu")  # no GPU here
    assert ev.eval_device("cuda:1") == torch.device("cuda", 1)
    _pretend_cuda(monkeypatch)
    assert ev.eval_device() == torch.device("cuda", 0)
    assert ev.eval_device("cpu") == torch.device("cpu")


def test_evaluate_puts_the_model_on_the_gpu_and_says_so(monkeypatch, capsys):
    data = load_default_dataset(n_train=0, n_test=2)["test"]
    config = EvalConfig(k=1, temperatures=[1.0], max_completion_length=4, show_progress=False)
    evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, name="tiny")
    assert "evaluate tiny: model on cpu (float32)" in capsys.readouterr().out
    moved = _pretend_cuda(monkeypatch)
    evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, name="tiny")
    assert moved == ["cuda:0"] and "evaluate tiny: model on cuda:0 (float32)" in capsys.readouterr().out
    evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, name="tiny", device="cpu")
    assert moved == ["cuda:0"] and "evaluate tiny: model on cpu (float32)" in capsys.readouterr().out


def test_cli_device_flags(monkeypatch, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="evaluate writes plots")
    from trl_variants import cli

    argv = ["evaluate", "--models", "tiny", "--max_prompts", "2", "--k", "1", "--temperatures", "1.0",
            "--max_completion_length", "4", "--compute_entropy", "false", "--show_progress", "false"]
    cli.main([*argv, "--output_dir", str(tmp_path / "cpu")])
    assert "evaluate tiny: model on cpu (float32)" in capsys.readouterr().out
    moved = _pretend_cuda(monkeypatch)
    cli.main([*argv, "--output_dir", str(tmp_path / "gpu")])
    assert moved == ["cuda:0"] and "evaluate tiny: model on cuda:0 (float32)" in capsys.readouterr().out
    cli.main([*argv, "--use_cpu", "true", "--output_dir", str(tmp_path / "use_cpu")])
    assert moved == ["cuda:0"] and "evaluate tiny: model on cpu (float32)" in capsys.readouterr().out
    cli.main([*argv, "--device", "cuda:1", "--output_dir", str(tmp_path / "cuda1")])
    assert moved == ["cuda:0", "cuda:1"] and "evaluate tiny: model on cuda:1 (float32)" in capsys.readouterr().out


def test_vllm_scoring_pass_on_the_gpu_or_skipped_with_a_note(monkeypatch, capsys, tiny_tokenizer):
    """``--backend vllm`` (a fake engine): entropy is scored by the transformers model on the GPU; with nothing to
    score, the model stays on the CPU and the line says it is unused."""
    from trainers_tests.evaluation.test_evaluate import FakeLLM
    from trl_variants.generation import tokenize_prompts
    from trl_variants.presample.vllm_backend import VLLMGenerator

    data = load_default_dataset(n_train=0, n_test=3)["test"]
    ids = tokenize_prompts(tiny_tokenizer, data["prompt"])
    llm = FakeLLM(tiny_tokenizer, {tuple(p): s for p, s in zip(ids, data["solution"], strict=True)})
    monkeypatch.setattr(runner, "check_backend", lambda backend: None)
    monkeypatch.setattr(sampling, "offline_generator", lambda model, tokenizer, config, accelerator=None: VLLMGenerator(
        llm, [tokenizer.eos_token_id], name="vllm-fake", sampling_params=dict))
    moved = _pretend_cuda(monkeypatch)
    config = EvalConfig(k=2, temperatures=[1.0], max_completion_length=8, backend="vllm", show_progress=False)
    evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, name="tiny")
    assert moved == ["cuda:0"]
    assert "evaluate tiny: model on cuda:0 (float32): it scores the entropy" in capsys.readouterr().out
    evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, replace(config, compute_entropy=False), name="tiny")
    assert moved == ["cuda:0"]  # not moved
    assert "evaluate tiny: model on cpu (float32), unused: vLLM samples" in capsys.readouterr().out


# ------------------------------------------------------------------------------- --config training recipe ---
def math500_standin(path: Path, rows: int = 8) -> str:
    """A local stand-in of HuggingFaceH4/MATH-500 (its columns and its single ``test`` split), with problems of
    the embedded task the tiny model knows: ``problem``, ``solution`` (worked, ending in a boxed answer),
    ``answer``, ``subject``, ``level`` (1-5), ``unique_id``."""
    from datasets import Dataset, DatasetDict

    src = load_default_dataset(n_train=0, n_test=rows)["test"]
    problems = [p[0]["content"] for p in src["prompt"]]
    DatasetDict({"test": Dataset.from_dict({
        "problem": problems,
        "solution": [f"Adding up, the total is $\\boxed{{{a}}}$." for a in src["solution"]],
        "answer": list(src["solution"]),
        "subject": ["Prealgebra"] * rows,
        "level": [1 + i % 5 for i in range(rows)],
        "unique_id": [f"test/prealgebra/{i}.json" for i in range(rows)],
    })}).save_to_disk(str(path))
    return str(path)


def test_recipe_keys_taken_ignored_and_overridden(capsys):
    from trl_variants.cli.evaluate_command import parse_evaluate_args

    args, config = parse_evaluate_args(["--config", "erpo/qwen2.5-math-7b", "--max_completion_length", "100"])
    out = capsys.readouterr().out
    assert re.search(r"training-only keys ignored: .*learning_rate.*", out) and "output_dir" in out
    assert "evaluate that model with --models outputs/Qwen2.5-Math-7B-ERPO" in out
    assert args.models == ["Qwen/Qwen2.5-Math-7B"] and config.temperatures == [1.0] and config.top_p == 0.99
    assert args.dataset_name == "DigitalLearningGmbH/MATH-lighteval" and args.filter_column == "level"
    assert args.prompt_column == "problem" and "\\boxed{}" in args.prompt_suffix and args.dtype == "bfloat16"
    assert config.max_completion_length == 100  # the flag overrides the recipe
    assert args.output_dir == "eval" and config.seed == EvalConfig().seed  # training's output_dir / seed not taken
    # a benchmark on the command line replaces the recipe's data set and the keys that only fit it
    args, _ = parse_evaluate_args(["--config", "dph/qwen2.5-math-7b", "--dataset_name", "HuggingFaceH4/MATH-500",
                                   "--prompt_column", "problem"])
    assert "replaces the recipe's dataset_name, dataset_config, prompt_regex" in capsys.readouterr().out
    assert (args.dataset_name, args.dataset_config, args.prompt_regex) == ("HuggingFaceH4/MATH-500", None, None)
    assert args.system_prompt.startswith("Please reason step by step") and args.prompt_format == "chat"


def test_a_key_neither_command_knows_is_still_refused(tmp_path):
    from trl_variants.cli.evaluate_command import parse_evaluate_args

    recipe = tmp_path / "typo.yaml"
    recipe.write_text("learning_rate: 1.0e-6\nmax_completion_lenght: 64\n")
    with pytest.raises(ValueError, match=r"Unknown arguments.*max_completion_lenght"):
        parse_evaluate_args(["--config", str(recipe)])


def test_evaluate_a_training_recipe_on_a_math500_standin(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="evaluate writes plots")
    from trl_variants import cli

    data = math500_standin(tmp_path / "math500")
    out = tmp_path / "eval"
    cli.main(["evaluate", "--config", "erpo/tiny_cpu", "--models", "tiny", "--dataset_name", data,
              "--dataset_test_split", "test", "--prompt_column", "problem", "--solution_column", "answer",
              "--k", "2", "--max_completion_length", "6", "--show_progress", "false", "--output_dir", str(out)])
    captured = capsys.readouterr()
    assert "--config erpo/tiny_cpu (the shipped recipe erpo/tiny_cpu): a training recipe" in captured.out
    assert re.search(r"ignored: .*num_generations.*query_kl_coef", captured.out)
    assert "evaluate tiny: model on cpu (float32)" in captured.out  # the recipe's use_cpu
    assert re.search(r"warning: tiny: \d+% of samples stopped at max_completion_length=6 .*raise "
                     r"--max_completion_length", captured.err)
    res = json.loads((out / "results.json").read_text())[0]
    assert res["name"] == "tiny" and res["num_prompts"] == 8 and list(res["temperatures"]) == ["1.0"]  # recipe's T
    assert res["config"]["max_completion_length"] == 6 and res["greedy_stopped_at_limit"] > 0.1
    assert set(res["temperatures"]["1.0"]["avg_by_level"]) == {"1", "2", "3", "4", "5"}
    assert (out / "chunks" / "tiny.jsonl").exists()


# the paper recipes' commands in docs/evaluation.md, run on the CPU: the tiny model on the stand-in
def _docs_commands() -> dict[str, str]:
    text = (ROOT / "docs" / "evaluation.md").read_text()
    commands = {}
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            m = re.match(r"trl-variants evaluate --config (\S+)", command.strip())
            # the benchmark commands (a CPU rehearsal of one, on a local stand-in, is not one of them)
            if m and not m.group(1).endswith("tiny_cpu") and "--dataset_name HuggingFaceH4/" in command:
                commands.setdefault(m.group(1), command.strip())
    return commands


PAPER_RECIPES = sorted(f"{p.parent.name}/{p.stem}" for method in ("erpo", "eepo", "dph", "apo")
                       for p in (ROOT / "trl_variants" / "recipes" / method).glob("*.yaml") if p.stem != "tiny_cpu")


def test_docs_give_every_paper_recipe_its_benchmark_command():
    commands = _docs_commands()
    assert sorted(commands) == PAPER_RECIPES
    for command in commands.values():
        assert "--dataset_name HuggingFaceH4/MATH-500 --dataset_test_split test" in command
        assert "--prompt_column problem --solution_column answer" in command


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_docs_benchmark_command_parses_and_loads_the_benchmark(recipe, tmp_path, monkeypatch):
    """Each docs command with the tiny model and the stand-in in place of the trained model and MATH-500: it
    parses, and the benchmark is loaded with the recipe's prompt (sampling is tested above)."""
    from trl_variants import cli

    argv = shlex.split(_docs_commands()[recipe])[2:]
    swap = {"--models": "tiny", "--dataset_name": math500_standin(tmp_path / "math500"), "--base_model": "tiny",
            "--backend": "hf"}
    argv = [swap.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    seen = {}

    def fake_evaluate(model, tokenizer, dataset, rewards, config, **kwargs):
        seen.update(model=model, dataset=dataset, config=config, kwargs=kwargs)
        raise SystemExit(0)  # stop before sampling

    monkeypatch.setattr(ev, "evaluate", fake_evaluate)
    with pytest.raises(SystemExit):
        cli.main(["evaluate", *argv, "--output_dir", str(tmp_path / "eval")])
    assert seen["model"] == DEFAULT_MODEL_PATH and len(seen["dataset"]) == 8
    assert seen["dataset"]["solution"] == load_default_dataset(n_train=0, n_test=8)["test"]["solution"]
    prompt = seen["dataset"][0]["prompt"]
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    assert "\\boxed{}" in text or "\\boxed{}" in str(prompt)  # the recipe's instruction reached the prompt
    assert seen["config"].max_completion_length >= 1024 and seen["kwargs"]["dtype"] == "bfloat16"


@needs_continuous_batching
def test_an_in_training_evaluation_generates_as_the_trainer_does():
    """HeldOutCallback / PassAtKCallback evaluate with the trainer's static cache or continuous batching (they used
    plain ``generate`` whatever the trainer's options); a config that sets an engine itself keeps it."""
    from types import SimpleNamespace

    from trl_variants.evaluation import EvalConfig
    from trl_variants.evaluation.callbacks import callback_config

    def trainer(**options):
        args = SimpleNamespace(disable_tqdm=True, cache_implementation=None,
                               transformers_continuous_batching_config=None)
        for name, value in options.items():
            setattr(args, name, value)
        return SimpleNamespace(args=args, use_vllm=False,
                               use_transformers_continuous_batching=options.get("continuous", False))

    assert callback_config(trainer(cache_implementation="static"), EvalConfig(k=2)).cache_implementation == "static"
    plain = callback_config(trainer(), EvalConfig(k=2))
    assert plain.cache_implementation is None and not plain.use_transformers_continuous_batching
    own = callback_config(trainer(cache_implementation="static"), EvalConfig(k=2, cache_implementation="dynamic"))
    assert own.cache_implementation == "dynamic"
    continuous = callback_config(trainer(continuous=True), EvalConfig(k=2))
    assert continuous.use_transformers_continuous_batching
    assert continuous.transformers_continuous_batching_config == {"max_memory_percent": 0.5}  # as TRL sizes it


def _sharded_trainer(sharding: str, stage: int = 3):
    """A stand-in trainer as the evaluation callbacks read it: ``sharding`` one of zero3, zero3_no_gather, fsdp1,
    fsdp2 (FSDP only at ``stage`` 3; ZeRO at ``stage``)."""
    from types import SimpleNamespace

    fsdp = sharding.startswith("fsdp") and stage == 3
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=stage),
                            fsdp_plugin=SimpleNamespace(fsdp_version=int(sharding[-1])) if fsdp else None)
    return SimpleNamespace(
        is_fsdp_enabled=fsdp, is_deepspeed_enabled=sharding.startswith("zero3"), use_vllm=True,
        accelerator=SimpleNamespace(state=state),
        args=SimpleNamespace(disable_tqdm=True, temperature=1.0, top_p=1.0, max_completion_length=8, seed=0,
                             ds3_gather_for_generation=sharding != "zero3_no_gather"))


def test_evaluation_during_training_under_fsdp2_on_torch_older_than_2_8_is_refused_before_training(monkeypatch):
    """torch 2.7's FSDPModule has no ``set_reshard_after_forward``, which keeps the gathered weights through the
    evaluation's forwards: under torch 2.7 the evaluation under FSDP2 stopped at its first sampling with an
    AttributeError (test_equivalence.py's EEPO case, `scripts/check_torch_versions.py`). Refused when the callback is
    made, naming the version and the ways out."""
    import torch.distributed.fsdp as fsdp

    from trl_variants.evaluation.callbacks import HeldOutCallback

    trainer = _sharded_trainer("fsdp2")
    if hasattr(fsdp.FSDPModule, "set_reshard_after_forward"):  # torch >= 2.8: taken; then as torch 2.7 has it
        assert HeldOutCallback(trainer, [], k=2, plot=False).config.backend == "hf"
        monkeypatch.delattr(fsdp.FSDPModule, "set_reshard_after_forward")
    with pytest.raises(ValueError, match=r"held-out evaluation during training under FSDP2 needs torch >= 2\.8 .*"
                                         r"upgrade torch.*trl-variants evaluate.*--heldout_eval_steps 0"):
        HeldOutCallback(trainer, [], k=2, plot=False)


@pytest.mark.parametrize("sharding", ["zero3", "fsdp2", "fsdp1", "zero3_no_gather"])
def test_evaluation_during_training_where_the_weights_are_sharded(sharding):
    """Under ZeRO-3 / FSDP each process samples its own chunks for its own number of decoding steps, so the
    evaluation holds the full weights on every process (``whole_policy_for_generation``; runs under ZeRO-3 and
    FSDP2 in distributed/test_equivalence.py and results/distributed/heldout.md). Refused where it cannot: FSDP1, and
    ZeRO-3 with ``ds3_gather_for_generation=False`` (the model may not fit on one device), naming the fix; and the
    vLLM backend there (untested). ZeRO-2 takes either backend."""
    from trl_variants.evaluation.callbacks import HeldOutCallback, PassAtKCallback

    def trainer(stage):
        return _sharded_trainer(sharding, stage)

    refusal = {"fsdp1": r"FSDP1 cannot hold the full weights.*fsdp_version: 2.*trl-variants evaluate",
               "zero3_no_gather": r"DeepSpeed ZeRO-3 .*sets ds3_gather_for_generation=False.*set it True.*trl-variants evaluate"}
    if sharding in refusal:
        with pytest.raises(ValueError, match=r"held-out evaluation during training under " + refusal[sharding]):
            HeldOutCallback(trainer(3), [], k=2, plot=False)
        with pytest.raises(ValueError, match=refusal[sharding]):
            PassAtKCallback(trainer(3), [], EvalConfig(k=2))
    else:
        assert HeldOutCallback(trainer(3), [], k=2, plot=False).config.backend == "hf"
        assert PassAtKCallback(trainer(3), [], EvalConfig(k=2)).config.k == 2
    with pytest.raises(ValueError, match=r"backend='vllm' is not supported under DeepSpeed ZeRO-3 or FSDP.*use "
                                         r"backend='hf'.*trl-variants evaluate --backend vllm"):
        HeldOutCallback(trainer(3), [], k=2, plot=False, backend="vllm")
    with pytest.raises(ValueError, match="backend='vllm' is not supported under"):
        PassAtKCallback(trainer(3), [], EvalConfig(k=2, backend="vllm"))
    if sharding == "zero3":  # ZeRO-2 (full weights on every process) takes the vLLM backend
        assert HeldOutCallback(trainer(2), [], k=2, plot=False, backend="vllm").config.backend == "vllm"
