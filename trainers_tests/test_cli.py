"""``trl-variants --help``, ``presample --help`` and ``evaluate --help`` document every flag; without matplotlib
``evaluate`` and the held-out curves write their numbers and skip the plots with a note."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from trl_variants import cli
from trl_variants.cli import evaluate_command, presample_command
from trl_variants.evaluate import EvalConfig
from trl_variants.presample import PresampleConfig

PARSED = {"presample": (presample_command.PresampleScriptArguments, PresampleConfig),
          "evaluate": (evaluate_command.EvaluateScriptArguments, EvalConfig)}


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _flag_help(text: str) -> dict[str, str]:
    """``{--flag: its help text}`` for every option entry of an argparse help page."""
    entries, current = [], None
    for line in text.splitlines():
        if re.match(r"^  -", line):
            current = [line]
            entries.append(current)
        elif current is not None and re.match(r"^ {3,}\S", line):
            current.append(line)
        else:
            current = None
    out = {}
    for first, *rest in entries:
        m = re.match(r"(.*?\S)\s{2,}(\S.*)$", first.strip())  # help on the same line after 2+ spaces, or below
        invocation, same_line = (m.group(1), m.group(2)) if m else (first.strip(), "")
        help_text = " ".join([same_line, *(r.strip() for r in rest)]).strip()
        for flag in re.findall(r"--[\w-]+", invocation):
            out[flag] = help_text
    return out


def test_top_level_help_lists_commands(capsys):
    text = _help(capsys, ["--help"])
    for name in cli.COMMANDS:
        assert f"  {name} " in text and cli.COMMAND_HELP[name] in text
    assert "trl-variants COMMAND --help" in text


@pytest.mark.parametrize("command", list(PARSED))
def test_every_flag_has_help(capsys, command):
    text = _help(capsys, [command, "--help"])
    flags = _flag_help(text)
    for cls in PARSED[command]:
        for f in dataclasses.fields(cls):
            assert f"--{f.name}" in flags, f"{command}: --{f.name} missing from --help"
    assert "--config FILE.yaml: read the options above from a YAML file" in " ".join(text.split())
    undocumented = [flag for flag, h in flags.items() if not re.sub(r"\(default: .*\)$", "", h).strip()]
    assert not undocumented, f"{command}: flags without help text: {undocumented}"


RESULT = {"name": "m", "num_prompts": 2, "config": {"k": 2, "max_completion_length": 8},
          "temperatures": {"1.0": {"avg@2": 0.5, "pass@k": {"1": 0.5, "2": 0.75}, "mean_length": 3.0}}}


def test_without_matplotlib_the_report_and_heldout_curves_keep_the_numbers_and_say_so(monkeypatch, tmp_path,
                                                                                       capsys):
    from types import SimpleNamespace

    import trl_variants.evaluate as ev

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    paths = ev.write_report([RESULT], tmp_path / "eval")
    assert set(paths) == {"json", "markdown"} and not list((tmp_path / "eval").glob("*.png"))
    assert "| m | 1.0 |" in (tmp_path / "eval" / "results.md").read_text()
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [ev.PLOTS_SKIPPED.format(where=f"{paths['json']} and {paths['markdown']}")]

    args = SimpleNamespace(temperature=1.0, top_p=1.0, max_completion_length=8, seed=0, disable_tqdm=True,
                           output_dir=str(tmp_path / "run"))
    callback = ev.HeldOutCallback(SimpleNamespace(args=args), ["q"] * 4, k=2, eval_steps=1)  # no ImportError here
    callback.history = [{"step": 0, "greedy": 0.25, "avg@2": 0.25}, {"step": 2, "greedy": 0.5, "avg@2": 0.5}]
    state = SimpleNamespace(global_step=2, is_world_process_zero=True, log_history=[{"reward": 0.5, "step": 1}])
    callback.on_train_end(args, state, None)
    assert (tmp_path / "run" / "heldout.json").exists() and not (tmp_path / "run" / "heldout_curves.png").exists()
    assert "plots skipped: matplotlib is not installed (pip install 'trl-variants[plots]')" in capsys.readouterr().out


def test_presample_scores_with_a_reward_model_as_grpo_trainer_does(tmp_path):
    """``trl-variants presample --reward_model_name_or_path``: the stored per-function rewards are the reward model's
    scores of prompt + completion (its tokenizer, chat template, first logit), next to the verifier's."""
    from datasets import load_from_disk

    from trainers_tests.helpers import tiny_reward_model
    from trl_variants.data import load_reward_model
    from trl_variants.presample.metadata import presample_metadata

    path = tiny_reward_model(tmp_path / "tiny-rm")
    out = tmp_path / "presampled"
    cli.main(["presample", "--reward_model_name_or_path", path, "--reward_funcs", "accuracy_reward",
              "--embedded_train_size", "4", "--num_samples", "2", "--max_completion_length", "8",
              "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(out), "--show_progress", "false"])
    ds = load_from_disk(str(out))
    assert presample_metadata(ds)["reward_funcs"] == ["tiny-rm", "accuracy_reward"]
    scorer = load_reward_model(path)
    for row in ds:
        completions = [[{"role": "assistant", "content": t}] for t in row["ref_completions"]]
        expected = scorer(prompts=[row["prompt"]] * 2, completions=completions)
        assert [r[0] for r in row["ref_rewards_per_func"]] == pytest.approx(expected, abs=1e-6)
        assert [r[1] for r in row["ref_rewards_per_func"]] in ([0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0])
    assert "tiny-rm" in (out / "README.md").read_text()


@pytest.mark.parametrize("recipe,samples", [("dph/qwen2.5-math-7b", "num_presamples"),
                                             ("apo/qwen2.5-7B", "num_value_samples")])
def test_presample_config_of_a_paper_recipe_is_its_trainers_pass(recipe, samples, capsys):
    """``presample --config <training recipe>``: the dataset the recipe's trainer would make itself (its pass's
    options, the trainer's sampling and seed, the recipe's model, data and prompt), training-only keys named."""
    import yaml

    from trl_variants.recipe_catalog import resolve_recipe

    raw = yaml.safe_load(resolve_recipe(recipe).read_text())
    script_args, config = presample_command.parse_presample_args(["--config", recipe, "--output_dir", "x"])
    assert config.num_samples == raw[samples] and (config.temperature, config.top_p) == (raw["temperature"],
                                                                                         raw.get("top_p", 1.0))
    assert (config.max_completion_length, config.seed, config.generation_batch_size) == (
        raw["max_completion_length"], raw["seed"], 64)  # 64: the method's presample_generation_batch_size default
    assert config.record_completion_logps == recipe.startswith("dph") and not config.record_prompt_logp
    assert (config.value_beta, config.shard_size) == ((raw["value_beta"], 64) if recipe.startswith("apo") else (None, 64))
    assert config.backend == "vllm"  # the recipe's use_vllm
    assert (script_args.model_name_or_path, script_args.dataset_name, script_args.output_dir) == (
        raw["model_name_or_path"], raw["dataset_name"], "x")  # the recipe's output_dir is its model's
    assert script_args.system_prompt == raw.get("system_prompt") and script_args.prompt_regex == raw.get("prompt_regex")
    said = capsys.readouterr().out
    assert "training-only keys ignored: " in said and "learning_rate" in said and samples not in said.split("ignored")[1]


def test_presample_config_refuses_a_recipe_without_a_sampling_pass():
    with pytest.raises(ValueError, match="the erpo recipe has nothing to presample: ERPO's pass only scores"):
        presample_command.parse_presample_args(["--config", "erpo/qwen2.5-math-7b"])
    with pytest.raises(ValueError, match="the grpo recipe has nothing to presample: GRPO has no offline pass"):
        presample_command.parse_presample_args(["--config", "grpo/tiny_cpu"])
    # a composed recipe whose parts hold dph_rehearsal: DPH-RL's pass, with the composed recipe's num_presamples (4)
    _, config = presample_command.parse_presample_args(["--config", "composed/tiny_cpu"])
    assert (config.num_samples, config.record_completion_logps, config.max_completion_length) == (4, True, 64)


def test_a_recipes_presampled_dataset_trains_without_a_pass_of_its_own(tmp_path, monkeypatch):
    """``presample --config dph/tiny_cpu`` then ``train dph --config dph/tiny_cpu --dataset_name <it>``: the trainer
    takes the stored samples (its own pass would fail the test) and trains."""
    from trl_variants.dph.part import Rehearsal

    data = tmp_path / "presampled"
    cli.main(["presample", "--config", "dph/tiny_cpu", "--embedded_train_size", "16", "--output_dir", str(data),
              "--cache_dir", str(tmp_path / "cache"), "--show_progress", "false", "--torch_threads", "1"])
    monkeypatch.setattr(Rehearsal, "_run_presample", lambda *a, **k: pytest.fail("the trainer ran its own pass"))
    cli.main(["train", "dph", "--config", "dph/tiny_cpu", "--dataset_name", str(data), "--max_steps", "1",
              "--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "out"), "--save_strategy", "no",
              "--torch_threads", "1"])
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_presample_reads_a_dataset_mixture_and_names_it_on_the_card(tmp_path):
    from datasets import load_from_disk

    from trl_variants.default import load_default_dataset

    dirs = []
    for seed, n in ((1, 3), (2, 2)):
        d = tmp_path / f"part{seed}"
        d.mkdir()
        load_default_dataset(n_train=n, n_test=1, seed=seed)["train"].to_json(d / "train.jsonl")
        dirs.append(str(d))
    out = tmp_path / "presampled"
    cli.main(["presample", "--datasets", *dirs, "--num_samples", "0", "--cache_dir", str(tmp_path / "cache"),
              "--output_dir", str(out), "--show_progress", "false"])
    ds = load_from_disk(str(out))
    assert ds["solution"] == [*load_default_dataset(n_train=3, n_test=1, seed=1)["train"]["solution"],
                              *load_default_dataset(n_train=2, n_test=1, seed=2)["train"]["solution"]]
    card = (out / "README.md").read_text()
    assert "mixture" in card and dirs[0] in card and dirs[1] in card


def test_presample_split_test_refuses_a_named_dataset_before_loading_it(monkeypatch, tmp_path):
    monkeypatch.setattr(presample_command, "load_datasets", lambda *a, **k: pytest.fail("loaded data before refusing"))
    with pytest.raises(ValueError, match=r"--split test is only supported for the embedded dataset"):
        cli.main(["presample", "--split", "test", "--dataset_name", "org/data", "--output_dir", str(tmp_path)])


def test_presample_push_to_hub_is_checked_before_the_pass(monkeypatch, tmp_path):
    """The push comes after a pass that may take hours: a placeholder id, no token or no network stop it first."""
    monkeypatch.setattr(presample_command, "load_datasets", lambda *a, **k: pytest.fail("loaded data before refusing"))
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"checked before the pass\):\n  - push_to_hub: true with the placeholder "
                                         r"hub_dataset_id 'your-org/x': pass --hub_dataset_id <you>/x.*\n  - .*hf auth "
                                         r"login.*\n  - .*HF_HUB_OFFLINE is set"):
        cli.main(["presample", "--push_to_hub", "true", "--hub_dataset_id", "your-org/x", "--output_dir",
                  str(tmp_path)])


def test_evaluate_refuses_a_reward_model_before_loading_anything(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="evaluate checks matplotlib first")
    monkeypatch.setattr(evaluate_command, "load_eval_dataset", lambda *a, **k: pytest.fail("data loaded before the refusal"))
    with pytest.raises(ValueError, match=r"--reward_model_name_or_path is not supported by evaluate"):
        cli.main(["evaluate", "--reward_model_name_or_path", "org/rm", "--output_dir", str(tmp_path)])


def test_presample_and_evaluate_filter_prompt_length_with_the_models_tokenizer(tmp_path, monkeypatch):
    """``--filter_prompt_length`` works in both commands: the prompts kept are exactly those of at most N tokens of
    the model's tokenizer (counted by hand here), and the presampled dataset's card says so."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)

    def n_tokens(messages):  # the prompt as GRPOTrainer feeds it: the chat template with the generation prompt
        return len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"])

    train = load_default_dataset(n_train=40, n_test=30, seed=3)
    lengths = sorted(n_tokens(p) for p in train["train"]["prompt"])
    limit = lengths[len(lengths) // 2]  # keeps about half
    want = [p for p in train["train"]["prompt"] if n_tokens(p) <= limit]
    assert 0 < len(want) < 40
    out = tmp_path / "presampled"
    cli.main(["presample", "--embedded_train_size", "40", "--embedded_test_size", "30", "--embedded_seed", "3",
              "--filter_prompt_length", str(limit), "--num_samples", "0", "--cache_dir", str(tmp_path / "cache"),
              "--output_dir", str(out), "--show_progress", "false"])
    assert load_from_disk(str(out))["prompt"] == want
    assert f"prompts of at most {limit} tokens" in (out / "README.md").read_text()
    # --split test: the embedded test split, cut the same way (and only it is loaded and filtered)
    test_want = [p for p in train["test"]["prompt"] if n_tokens(p) <= limit]
    cli.main(["presample", "--split", "test", "--embedded_train_size", "40", "--embedded_test_size", "30",
              "--embedded_seed", "3", "--filter_prompt_length", str(limit), "--num_samples", "0",
              "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "test_split"),
              "--show_progress", "false"])
    assert load_from_disk(str(tmp_path / "test_split"))["prompt"] == test_want and 0 < len(test_want) < 30
    # ... and prepared as the train split is (and as evaluate prepares it): here, with the system prompt
    cli.main(["presample", "--split", "test", "--embedded_train_size", "40", "--embedded_test_size", "30",
              "--embedded_seed", "3", "--system_prompt", "Answer briefly.", "--num_samples", "0",
              "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "test_system"),
              "--show_progress", "false"])
    prompts = load_from_disk(str(tmp_path / "test_system"))["prompt"]
    assert prompts == [[{"role": "system", "content": "Answer briefly."}, *p] for p in train["test"]["prompt"]]

    seen = {}

    def fake_evaluate(model, tokenizer, dataset, *args, **kwargs):
        seen["prompts"] = list(dataset["prompt"])
        raise SystemExit(0)  # stop before sampling: the dataset handed to evaluation is what is checked

    pytest.importorskip("matplotlib", reason="evaluate checks matplotlib first")
    import trl_variants.evaluation as ev

    monkeypatch.setattr(ev, "evaluate", fake_evaluate)
    with pytest.raises(SystemExit):
        cli.main(["evaluate", "--embedded_train_size", "40", "--embedded_test_size", "30", "--embedded_seed", "3",
                  "--filter_prompt_length", str(limit), "--output_dir", str(tmp_path / "eval")])
    test_want = [p for p in train["test"]["prompt"] if n_tokens(p) <= limit]
    assert seen["prompts"] == test_want and 0 < len(test_want) < 30


# --- CLI edges: python -m, unknown commands, per-command help, held-out defaults, the cache ---------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_python_m_trl_variants_runs_the_cli():
    import os
    import subprocess

    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "trl_variants", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trl-variants COMMAND --help" in proc.stdout and all(f"  {name} " in proc.stdout for name in cli.COMMANDS)
    proc = subprocess.run([sys.executable, "-m", "trl_variants", "nope"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "unknown command 'nope'" in proc.stderr


@pytest.mark.parametrize("argv,named", [(["foo"], "unknown command 'foo'"), (["presampel", "--help"],
                                                                             "unknown command 'presampel'"),
                                        (["--config", "x.yaml"], "'--config'")])
def test_unknown_command_is_named(capsys, argv, named):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "choose one of: " + ", ".join(cli.COMMANDS) in err


@pytest.mark.parametrize("command", list(PARSED))
def test_help_lists_only_the_flags_the_command_uses(capsys, command):
    flags = _flag_help(_help(capsys, [command, "--help"]))
    assert not [f for f in flags if f.startswith("--heldout")], f"{command} --help lists training-only flags"


class _FakeTrainer:
    def __init__(self, **kwargs):
        self.callbacks = []

    def add_callback(self, callback):
        self.callbacks.append(callback)


def _run_example(monkeypatch, argv):
    """``examples/train_erpo.py ARGV`` up to the trainer (nothing loads or trains)."""
    from trl_variants import ERPOConfig
    from trl_variants.training import run

    monkeypatch.setattr(run, "trainer_kwargs", lambda *a: {})
    monkeypatch.setattr(run, "train_and_save", lambda *a: None)
    return run.run_training(_FakeTrainer, ERPOConfig, ROOT / "configs" / "erpo" / "tiny_cpu.yaml", argv=argv)


def test_example_with_another_dataset_drops_the_default_yamls_heldout_settings(monkeypatch, capsys, tmp_path):
    # the user never passed --heldout_eval_steps: it comes from the example's default YAML, made for the embedded task
    trainer = _run_example(monkeypatch, ["--dataset_name", "org/data", "--output_dir", str(tmp_path)])
    assert trainer.callbacks == []
    out = capsys.readouterr().out
    assert "held-out evaluation off" in out and "configs/erpo/tiny_cpu.yaml" in out and "'org/data'" in out


def test_example_heldout_error_names_where_the_setting_came_from(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"--heldout_eval_steps 10 \(command line\) evaluates on the embedded task.*"
                                         r"'org/data'.*drop --heldout_eval_steps"):
        _run_example(monkeypatch, ["--dataset_name", "org/data", "--heldout_eval_steps", "10",
                                   "--output_dir", str(tmp_path)])
    own = tmp_path / "mine.yaml"
    own.write_text("dataset_name: org/data\nheldout_eval_steps: 5\nuse_cpu: true\n")
    with pytest.raises(ValueError, match=rf"heldout_eval_steps: 5 \(in {own}\).*remove it from {own} or pass "
                                         r"--heldout_eval_steps 0"):
        _run_example(monkeypatch, ["--config", str(own), "--output_dir", str(tmp_path)])


def _cache_entry(root, key, complete=True, shards=2, done=1):
    import json

    entry = root / key
    entry.mkdir(parents=True)
    (entry / "options.json").write_text(json.dumps({"key": key, "options": {"num_samples": 4}, "rows": 10,
                                                    "shards": shards}))
    for s in range(done):
        (entry / f"shard-{s:06d}.json").write_text("{}")
    if complete:
        (entry / "dataset").mkdir()
        (entry / "dataset" / "state.json").write_text("{}")
    return entry


def test_cache_list_and_clear(tmp_path, capsys, monkeypatch):
    """``trl-variants cache list`` shows the offline-pass cache entries (made by a real pass here);
    ``cache clear`` removes entries only with --yes (or a yes at the prompt) and never anything that is not one."""
    cache = tmp_path / "cache"
    cli.main(["presample", "--embedded_train_size", "4", "--num_samples", "0", "--cache_dir", str(cache),
              "--output_dir", str(tmp_path / "out"), "--show_progress", "false"])
    (real,) = [p.name for p in cache.iterdir()]
    partial = _cache_entry(cache, "0123456789abcdef0123", complete=False, shards=3, done=1)
    (cache / "my_notes").mkdir()  # not a cache entry: never listed nor removed
    capsys.readouterr()
    cli.main(["cache", "list", "--cache_dir", str(cache)])
    out = capsys.readouterr().out
    assert str(cache) in out and "2 entries" in out and real in out and partial.name in out
    assert "complete" in out and "1/3 shards" in out and "my_notes" not in out
    assert " tiny\n" in out  # the model that made the complete entry (the tiny default, by the name records use)
    # the default location: $TRL_VARIANTS_CACHE
    monkeypatch.setenv("TRL_VARIANTS_CACHE", str(cache))
    cli.main(["cache", "list"])
    assert real in capsys.readouterr().out

    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(""))  # not a terminal: no prompt, nothing removed
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["cache", "clear", "--cache_dir", str(cache)])
    assert exit_info.value.code == 1 and "--yes" in capsys.readouterr().err
    assert (cache / real).is_dir() and partial.is_dir()
    cli.main(["cache", "clear", "--cache_dir", str(cache), "--yes", partial.name])  # one entry by its key
    assert not partial.exists() and (cache / real).is_dir()
    cli.main(["cache", "clear", "--yes"])  # all of them, in $TRL_VARIANTS_CACHE
    assert sorted(p.name for p in cache.iterdir()) == ["my_notes"]
    assert "removed 1 entry" in capsys.readouterr().out


# --- trl-variants train / recipes: the examples and the recipes inside the package ---------------


def test_the_recipes_ship_inside_the_package_and_configs_is_a_link_to_them():
    from trl_variants import recipe_catalog

    assert recipe_catalog.RECIPES_DIR == ROOT / "trl_variants" / "recipes"
    assert (ROOT / "configs").resolve() == recipe_catalog.RECIPES_DIR.resolve()  # a clone's configs/<method>/... still works
    assert {p.parent.name for p in recipe_catalog.shipped_recipes()} == {*recipe_catalog.METHODS, "accelerate"}
    for method in recipe_catalog.METHODS:
        assert recipe_catalog.default_recipe(method).is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"recipes/*/*.yaml"' in pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]


@pytest.mark.parametrize("value,expected", [
    ("erpo/qwen2.5-math-7b", "erpo/qwen2.5-math-7b.yaml"),
    ("erpo/qwen2.5-math-7b.yaml", "erpo/qwen2.5-math-7b.yaml"),
    ("qwen2.5-math-7b", "erpo/qwen2.5-math-7b.yaml"),  # a bare name: the method's folder first
    ("qwen2.5-math-7b.yaml", "erpo/qwen2.5-math-7b.yaml"),
    ("tiny_cpu", "erpo/tiny_cpu.yaml"),
    ("qwen2.5-7B", "apo/qwen2.5-7B.yaml"),  # only one folder has it
    ("configs/dph/qwen2.5-math-7b.yaml", "dph/qwen2.5-math-7b.yaml"),  # a recipe header's path, without a clone
    ("accelerate/zero2", "accelerate/zero2.yaml"),
])
def test_a_recipe_is_found_by_name(value, expected, tmp_path, monkeypatch):
    from trl_variants import recipe_catalog

    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert recipe_catalog.resolve_recipe(value, "erpo") == recipe_catalog.RECIPES_DIR / expected


def test_a_recipe_path_wins_and_an_unknown_or_ambiguous_name_is_refused(tmp_path, monkeypatch):
    from trl_variants import recipe_catalog

    monkeypatch.chdir(tmp_path)
    own = tmp_path / "erpo" / "tiny_cpu.yaml"
    own.parent.mkdir()
    own.write_text("max_steps: 3\n")
    assert recipe_catalog.resolve_recipe("erpo/tiny_cpu.yaml", "erpo") == Path("erpo/tiny_cpu.yaml")  # the file here
    assert recipe_catalog.resolve_recipe("erpo/tiny_cpu.yaml", "erpo", files=False) == recipe_catalog.default_recipe("erpo")
    with pytest.raises(FileNotFoundError, match=r"nope.yaml: no such file, and no shipped recipe .*erpo/tiny_cpu"):
        recipe_catalog.resolve_recipe("nope.yaml", "erpo")
    with pytest.raises(ValueError, match=r"several shipped recipes are named 'tiny_cpu' \(apo/tiny_cpu, "):
        recipe_catalog.resolve_recipe("tiny_cpu")


class _Parsed(Exception):
    pass


def _train(monkeypatch, argv):
    """``trl-variants train ARGV`` up to the trainer (nothing loads or trains): ``(script_args, training_args,
    model_args)``."""
    from trl_variants.training import run

    def stop(*parsed):
        raise _Parsed(parsed)

    monkeypatch.setattr(run, "trainer_kwargs", stop)
    with pytest.raises(_Parsed) as parsed:
        cli.main(["train", *argv])
    return parsed.value.args[0]


def test_train_runs_the_example_of_each_method_on_its_shipped_default(monkeypatch, tmp_path):
    import trl

    import trl_variants
    from trl_variants import recipe_catalog
    from trl_variants.training import run

    built = []
    monkeypatch.setattr(run, "run_training", lambda *a, **k: built.append((a, k)))
    for method, (module, trainer, config) in recipe_catalog.METHODS.items():
        cli.main(["train", method, "--max_steps", "3"])
        (args, kwargs) = built.pop()
        owner = trl if module == "trl" else trl_variants
        assert args == (getattr(owner, trainer), getattr(owner, config), recipe_catalog.default_recipe(method))
        assert kwargs == {"argv": ["--max_steps", "3"], "prog": f"trl-variants train {method}"}
        example = (ROOT / "examples" / f"train_{method}.py").read_text()
        assert f'train_main("{method}", {trainer}, {config})' in example  # the example is the same command
        assert len(example.split('"""', 2)[2].strip().splitlines()) <= 6  # ... and only that


def test_train_parses_a_shipped_recipe_by_name_with_flags_overriding_it(monkeypatch, tmp_path, capsys):
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)  # bf16 recipes
    monkeypatch.chdir(tmp_path)
    script_args, training_args, model_args = _train(monkeypatch, ["erpo", "--config", "erpo/qwen2.5-math-7b",
                                                                  "--max_steps", "4", "--output_dir", "o"])
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-Math-7B" and training_args.max_steps == 4
    assert script_args.dataset_name == "DigitalLearningGmbH/MATH-lighteval"
    assert "the shipped recipe erpo/qwen2.5-math-7b" in capsys.readouterr().out
    script_args, training_args, _ = _train(monkeypatch, ["eepo", "--output_dir", "o"])  # no --config: tiny_cpu
    assert training_args.use_cpu and script_args.dataset_name == "embedded"


def test_train_without_a_method_or_with_an_unknown_one_or_recipe_says_what_to_choose(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train"])
    assert exit_info.value.code == 2 and "trl-variants train {erpo,eepo,dph,apo,composed,grpo}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--max_steps", "2"])
    assert exit_info.value.code == 2 and "expected a method before the options, got '--max_steps'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "ppo"])
    assert exit_info.value.code == 2 and "unknown method 'ppo'; choose one of: erpo, eepo, dph, apo, composed, grpo" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--config erpo/qwen-72b: no such file, and no shipped recipe"):
        cli.main(["train", "erpo", "--config", "erpo/qwen-72b"])
    text = _help(capsys, ["train", "--help"])
    assert "accelerate launch -m trl_variants train erpo" in text and "accelerate launch $(which trl-variants)" in text
    text = _help(capsys, ["train", "apo", "--help"])
    assert text.startswith("usage: trl-variants train apo") and "--num_value_samples" in text


def test_recipes_lists_every_shipped_yaml_and_prints_a_path(capsys):
    from trl_variants import recipe_catalog

    for argv in (["recipes"], ["train", "--list"]):
        cli.main(argv)
        out = capsys.readouterr().out
        assert str(recipe_catalog.RECIPES_DIR) in out
        for path in recipe_catalog.shipped_recipes():
            assert f"  {recipe_catalog.recipe_name(path)} " in out
        assert "  erpo/tiny_cpu" in out and "default" in out and "8 processes" in out
    cli.main(["recipes", "--path", "accelerate/multi_gpu"])
    assert capsys.readouterr().out.strip() == str(recipe_catalog.RECIPES_DIR / "accelerate" / "multi_gpu.yaml")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["recipes", "--path", "nope"])
    assert exit_info.value.code == 2 and "no shipped recipe" in capsys.readouterr().err


def test_evaluate_with_only_a_base_model_evaluates_it_once(tmp_path):
    """`--base_model tiny` without --models: the base alone (it used to evaluate the same model again as 'assets')."""
    from trl_variants.cli import main

    main(["evaluate", "--base_model", "tiny", "--max_prompts", "4", "--k", "1", "--temperatures", "1.0",
          "--output_dir", str(tmp_path)])
    assert [r["name"] for r in json.loads((tmp_path / "results.json").read_text())] == ["base"]


def test_a_final_save_without_weights_is_an_error_before_the_card_and_the_push(tmp_path):
    """transformers' save_model writes no weights, with only a warning, under DeepSpeed ZeRO-3 with
    ``stage3_gather_16bit_weights_on_model_save`` off; the example went on to the card, the push and "model saved".
    (FSDP's SHARDED_STATE_DICT, the other case, is now saved whole: test_fsdp2.py.)"""
    from types import SimpleNamespace

    from trl_variants.training import run

    trainer = SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True, num_processes=1))
    (tmp_path / "training_args.bin").write_bytes(b"")  # written on every save: not weights
    (tmp_path / "global_step3").mkdir()  # what ZeRO-3 writes instead
    with pytest.raises(RuntimeError, match="wrote no model weights.*zero3_save_16bit_model: true"):
        run.check_saved_weights(trainer, str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    run.check_saved_weights(trainer, str(tmp_path))
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")  # a PEFT run saves its adapter
    run.check_saved_weights(trainer, str(tmp_path))


def test_weights_an_earlier_run_left_in_the_output_dir_are_not_taken_for_the_final_save(tmp_path):
    """A reused output_dir holds the last run's model.safetensors: a final save that writes nothing (ZeRO-3 without
    zero3_save_16bit_model) passed the check, and the card and the push went out with the earlier run's weights."""
    from types import SimpleNamespace

    from trl_variants.training import run

    trainer = SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True, num_processes=1))
    (tmp_path / "model.safetensors").write_bytes(b"earlier run")
    before = run.weight_files(str(tmp_path))
    assert set(before) == {"model.safetensors"}
    with pytest.raises(RuntimeError, match="only model.safetensors from an earlier run.*zero3_save_16bit_model"):
        run.check_saved_weights(trainer, str(tmp_path), before)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors").write_bytes(b"this run's weights")  # rewritten by the save: accepted
    run.check_saved_weights(trainer, str(tmp_path), before)
    before = run.weight_files(str(tmp_path))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")  # or a weight file the save wrote beside it
    run.check_saved_weights(trainer, str(tmp_path), before)
