"""Evaluation in chunks: finished chunks are appended to a results file and read back by a rerun, so an interrupted
evaluation resumes and ends with the numbers of an uninterrupted one; a file from other settings is refused,
naming what differs."""

import json

import pytest

import trl_variants.evaluation.runner as ev
from trl_variants import accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.evaluate import EvalConfig, evaluate

# 10 prompts in chunks of 4: 3 chunks per pass, greedy + one temperature = 6 chunks
CONFIG = dict(k=2, temperatures=[1.0], max_completion_length=8, chunk_size=4, seed=1, show_progress=False)


@pytest.fixture(scope="module")
def data():
    return load_default_dataset(n_train=0, n_test=10)["test"]


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("full") / "m.jsonl"
    return evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**CONFIG), name="m",
                    results_file=path), path


class Interrupted(Exception):
    pass


def _count_chunks(monkeypatch, fail_at: int | None = None):
    """Record the (pass, chunk) of every chunk sampled; raise at the ``fail_at``-th (1-based), as an interruption."""
    real, calls = ev.run_chunk, []

    def counting(model, tokenizer, rows, prompt_ids, row_indices, chunk, label, *args, **kwargs):
        calls.append((label, chunk))
        if fail_at is not None and len(calls) == fail_at:
            raise Interrupted
        return real(model, tokenizer, rows, prompt_ids, row_indices, chunk, label, *args, **kwargs)

    monkeypatch.setattr(ev, "run_chunk", counting)
    return calls


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_results_file_does_not_change_the_numbers(data, uninterrupted):
    plain = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**CONFIG), name="m")
    assert plain == uninterrupted[0]
    lines = _lines(uninterrupted[1])
    assert lines[0]["kind"] == "header" and lines[0]["key"]["k"] == 2
    assert [(r["pass"], r["chunk"]) for r in lines[1:]] == [(p, c) for p in ("greedy", "1.0") for c in range(3)]


def test_interrupted_evaluation_resumes_without_resampling(data, uninterrupted, tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    calls = _count_chunks(monkeypatch, fail_at=2)
    with pytest.raises(Interrupted):
        evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**CONFIG), name="m", results_file=path)
    assert calls == [("greedy", 0), ("greedy", 1)]
    assert [r.get("chunk") for r in _lines(path)] == [None, 0]  # the header and chunk 1, written as it finished

    calls = _count_chunks(monkeypatch)
    resumed = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**CONFIG), name="m",
                       results_file=path)
    assert ("greedy", 0) not in calls and len(calls) == 5  # chunk 1 read back, not sampled again
    assert resumed == uninterrupted[0]  # every number, per-prompt counts and float sums included

    calls = _count_chunks(monkeypatch)
    again = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**CONFIG), name="m",
                     results_file=path)
    assert calls == [] and again == uninterrupted[0]  # a finished evaluation is read back whole


def test_a_cut_last_line_is_computed_again(data, uninterrupted, tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    text = uninterrupted[1].read_text()
    path.write_text(text[: len(text) - 25])  # the last chunk's line cut short by an interruption
    calls = _count_chunks(monkeypatch)
    with pytest.warns(UserWarning, match="last line was cut"):
        resumed = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**CONFIG), name="m",
                           results_file=path)
    assert calls == [("1.0", 2)] and resumed == uninterrupted[0]
    assert path.read_text() == text  # the cut line replaced, not glued to


def test_other_settings_are_refused_naming_what_differs(data, uninterrupted, tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    path.write_text(uninterrupted[1].read_text())
    calls = _count_chunks(monkeypatch)
    other = EvalConfig(**{**CONFIG, "k": 3, "temperatures": [0.5, 1.0]})
    with pytest.raises(ValueError, match=r"another evaluation \(k: 2 in the file, 3 now; temperatures: \[1\.0\] in "
                                         r"the file, \[0\.5, 1\.0\] now\).*restart") as e:
        evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, other, name="m", results_file=path)
    assert str(path) in str(e.value) and calls == []
    with pytest.raises(ValueError, match=r"dataset: .* in the file"):  # other prompts
        evaluate(DEFAULT_MODEL_PATH, None, data.select(range(9)), accuracy_reward, EvalConfig(**CONFIG),
                 results_file=path)
    restarted = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, other, name="m", results_file=path,
                         restart=True)
    assert len(calls) == 9 and restarted["config"]["k"] == 3  # 3 passes x 3 chunks, nothing read back
    assert _lines(path)[0]["key"]["k"] == 3


def test_progress_bar_counts_the_read_back_prompts(data, uninterrupted, tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    lines = uninterrupted[1].read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]))  # the header and the first two greedy chunks (8 prompts)
    evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**{**CONFIG, "show_progress": True}),
             name="m", results_file=path)
    err = capsys.readouterr().err
    assert f"evaluate m: 2 of 6 chunks read back from {path}" in err
    assert "8/20" in err and "20/20" in err  # the bar starts at the prompts read back, total: 2 passes x 10


LAUNCHER = """
import sys
from accelerate import PartialState
PartialState(cpu=True, backend="gloo")  # a CPU-only machine: gloo, as the trainers' use_cpu + ddp_backend
from trl_variants.cli import main
main(sys.argv[1:])
import os, torch.distributed
assert not torch.distributed.is_initialized()  # evaluate destroyed its process group at the end
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # past the interpreter's teardown (Gloo threads, see helpers.run_two_ranks): the work is checked above
"""


def test_two_processes_share_the_chunks_and_resume_a_one_process_file(tmp_path):
    """``trl-variants evaluate`` on 2 processes: the same file and numbers as on 1, and a file an interrupted
    1-process run left is finished by 2 processes with the same result."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from trl_variants import cli

    argv = ["evaluate", "--max_prompts", "10", "--k", "2", "--temperatures", "1.0", "--max_completion_length", "8",
            "--chunk_size", "4", "--show_progress", "false"]
    cli.main([*argv, "--output_dir", str(tmp_path / "one")])
    name = Path(DEFAULT_MODEL_PATH).name
    one = (tmp_path / "one" / "chunks" / f"{name}.jsonl").read_text()
    (tmp_path / "two" / "chunks").mkdir(parents=True)
    (tmp_path / "two" / "chunks" / f"{name}.jsonl").write_text("".join(one.splitlines(keepends=True)[:3]))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(port),
                           str(tmp_path / "launch.py"), *argv, "--output_dir", str(tmp_path / "two")],
                          env=dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 of 6 chunks read back" in proc.stderr
    assert (tmp_path / "two" / "chunks" / f"{name}.jsonl").read_text() == one  # each chunk once, in order
    results = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two")]
    assert results[0] == results[1]


def test_a_results_file_seen_by_some_processes_only_is_read_from_the_writer(data, uninterrupted, tmp_path):
    """A results file on a disk local to each node: the writer (process 0) sees the chunks an interrupted run left,
    another process sees none. Each had planned its own rounds of chunks, so their collectives no longer matched and
    the run hung; the writer's records now decide for all, and the run ends with the uninterrupted numbers."""
    from ..helpers import run_two_ranks

    full, path = uninterrupted
    (tmp_path / "r0.jsonl").write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    script = tmp_path / "run.py"
    script.write_text(f"""
import json, torch
torch.set_num_threads(1)
from accelerate import PartialState
from trl_variants import accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.evaluate import EvalConfig, evaluate
state = PartialState(cpu=True)
data = load_default_dataset(n_train=0, n_test=10)["test"]
res = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, EvalConfig(**{CONFIG!r}), name="m",
               accelerator=state, results_file={str(tmp_path)!r} + f"/r{{state.process_index}}.jsonl")
json.dump(res, open({str(tmp_path)!r} + f"/res{{state.process_index}}.json", "w"), default=str)
print("OK")
""")
    run_two_ranks(script, 29543, timeout=180)
    expected = json.loads(json.dumps(full, default=str))
    for rank in (0, 1):
        assert json.loads((tmp_path / f"res{rank}.json").read_text()) == expected
