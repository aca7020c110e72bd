"""Reward time bound: every accuracy reward call is bounded in time, in any thread.

The first call of a process starts the worker (about 1.5 s, once); the ``warm`` fixture pays it so that each
timed call below measures the per-completion bound only.
"""

import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from trl_variants import rewards
from trl_variants.rewards import format_reward, last_boxed, make_accuracy_reward, prescreen

BOUND = 2.0  # the per-completion bound used in these tests (the default is REWARD_TIMEOUT_SECONDS)
SLACK = 1.0  # scheduling on a loaded machine, the worker kill, the result pipe
TOWER = "\\boxed{9^{9^{9^{9^{9}}}}}"
LOOP = "Wait, let me recompute: \\boxed{ 12 + {30} = 42, so "  # an unbalanced \boxed{ and a balanced group
PROSE = "the answer is 42 and I will check it again, "  # no braces


def adversarial(n: int = 100_000, final: str = "\\boxed{42}", prefix: str = "") -> str:
    """A degenerate policy's loop: ``n`` characters full of unbalanced ``\\boxed{``, then ``final``."""
    body = (LOOP * (n // len(LOOP) + 1))[: max(0, n - len(final) - len(prefix))]
    return prefix + body + final


def boxed_loop(n: int = 100_000) -> str:
    """A loop inside one balanced box: a 100k-character answer."""
    return "\\boxed{" + (PROSE * (n // len(PROSE) + 1))[:n] + "}"


class Metrics(dict):
    """Stands in for TRL's ``log_metric`` kwarg."""

    def __call__(self, name, value):
        self[name] = self.get(name, 0.0) + value


def in_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a worker thread: (result, seconds). Fails instead of hanging."""
    box = {}

    def run():
        box["thread"] = threading.current_thread() is not threading.main_thread()
        box["out"] = fn(*args, **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(60)
    elapsed = time.perf_counter() - start
    assert not thread.is_alive(), "the reward call did not return within 60 s"
    assert box["thread"]
    return box["out"], elapsed


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def rewards_alone(body: str) -> str:
    """A script for a fresh interpreter that loads rewards.py alone (no torch) as ``rewards``, then runs ``body``."""
    return textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("rewards_alone", {rewards.__file__!r})
        rewards = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rewards)
    """) + textwrap.dedent(body)


def all_end(pids: list[int], within: float = 5.0) -> bool:
    """Whether every process of ``pids`` has ended within ``within`` seconds."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.fixture(scope="module")
def warm():
    assert rewards.accuracy_reward(["\\boxed{1}"], ["1"]) == [1.0]
    for worker in list(rewards._POOL._idle):  # the warm spare has imported math-verify too
        worker.wait_ready()
    yield
    rewards.shutdown_reward_workers()


@pytest.fixture(autouse=True)
def fresh_results():
    rewards._RESULTS.clear()  # every pair goes to the worker, not to the cache of an earlier test


def _reference_last_boxed(text):
    """The specification: the last ``\\boxed{`` whose brace a depth scan closes (quadratic: small inputs)."""
    for start in range(len(text) - 7, -1, -1):
        if text.startswith("\\boxed{", start):
            depth = 0
            for j in range(start + 6, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[start + 7 : j]
    return None


def test_last_boxed_hand_built():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{2}{3}} c") == "\\frac{2}{3}"
    assert last_boxed("\\boxed{a{b}c} and \\boxed{d") == "a{b}c"
    assert last_boxed("} \\boxed{x} {") == "x"
    assert last_boxed("\\boxed{\\boxed{5}}") == "5"  # the last one to start
    assert last_boxed("\\boxed{}") == ""
    assert last_boxed("\\boxed{" * 1000) is None
    assert last_boxed("boxed{3}") is None
    assert last_boxed(adversarial()) == "42"
    assert last_boxed(adversarial(final="")) is None
    assert last_boxed(adversarial(final="", prefix="\\boxed{7} ")) == "7"  # the only balanced box: the first
    assert last_boxed(boxed_loop()) == (PROSE * 10_000)[:100_000]


def test_last_boxed_matches_the_depth_scan_specification():
    rng = random.Random(0)
    pieces = ["\\boxed{", "{", "}", "a", "7", "\\", "boxed", " "]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert last_boxed(text) == _reference_last_boxed(text), text


def _best_time(fn, text, reps=5):
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn(text)
        best = min(best, time.perf_counter() - start)
    return best


def test_extraction_is_linear():
    # No balanced box at all: every brace is visited (the old finder rescanned the text per \boxed{).
    small, large = adversarial(100_000, final=""), adversarial(200_000, final="")
    t_small, t_large = _best_time(last_boxed, small), _best_time(last_boxed, large)
    assert t_large < 0.5, f"200k characters took {t_large:.3f} s"
    assert t_large < 4 * t_small + 0.002, f"100k: {t_small:.4f} s, 200k: {t_large:.4f} s"
    assert _best_time(lambda t: format_reward([t]), large, reps=2) < 0.5


@pytest.mark.parametrize("answer", [
    "42", "-\\frac{3}{4}", "2^{2023}", "10^{100}", "2^{2^{5}}+1", "2^{2^{2^{2^{2}}}}", "e^{-x^2}", "x^{2}+1",
    "100!", "99999!", "3^{10} \\cdot 5", "(1, 5] \\cup [7, \\infty)", "1\\!000\\!000", "0^{0}", "10^{10^{6}}",
    "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
])
def test_prescreen_keeps_normal_answers(answer):
    assert prescreen(answer) is None


@pytest.mark.parametrize("answer,reason", [
    ("9^{9^{9^{9^{9}}}}", "exponent"), ("9^{9^{9}}", "exponent"), ("2^{10^{9}}", "exponent"),
    ("x^{9^{9}}", "exponent"), ("3^{3^{3^{3}}}", "exponent"), ("7^{0000000123456789}", "exponent"),
    ("10000000!", "factorial"), ("{1000000}!", "factorial"), ("1" * 1001, "length"),
])
def test_prescreen_refuses_pathological_answers(answer, reason):
    assert prescreen(answer) == reason


def test_adversarial_100k_completion_in_a_thread(warm):
    reward, metrics = make_accuracy_reward(BOUND), Metrics()
    completions = [
        adversarial(final="\\boxed{\\frac{84}{2}}"),  # many unbalanced \boxed{, a right answer at the end
        adversarial(final=""),  # no balanced box at all
        [{"role": "assistant", "content": boxed_loop()}],  # a 100k-character answer
    ]
    scores, elapsed = in_thread(reward, completions, ["42"] * 3, log_metric=metrics)
    assert scores == [1.0, 0.0, 0.0]
    assert elapsed < BOUND + SLACK, f"{elapsed:.2f} s"
    assert metrics == {"accuracy_reward/timeouts": 1.0, "accuracy_reward/timeouts_prescreened": 1.0}


def test_power_tower_in_a_thread(warm):
    reward, metrics = make_accuracy_reward(BOUND), Metrics()
    scores, elapsed = in_thread(reward, [TOWER, "so \\boxed{3}"], ["3", "3"], log_metric=metrics)
    assert scores == [0.0, 1.0]
    assert elapsed < BOUND + SLACK, f"{elapsed:.2f} s"
    assert metrics == {"accuracy_reward/timeouts": 1.0, "accuracy_reward/timeouts_prescreened": 1.0}


def test_power_tower_without_the_prescreen_is_bounded_by_the_worker(warm):
    reward, metrics = make_accuracy_reward(BOUND, prescreen=False, name="acc"), Metrics()
    scores, elapsed = in_thread(reward, [TOWER, "so \\boxed{3}"], ["3", "3"], log_metric=metrics)
    assert scores == [0.0, 1.0]
    assert elapsed < BOUND + SLACK, f"{elapsed:.2f} s"
    assert metrics == {"acc/timeouts": 1.0, "acc/timeouts_prescreened": 0.0}


def test_a_worker_that_never_answers_is_killed_and_replaced(warm):
    # A stopped worker stands for one stuck in C code (no signal handler can run there): only the parent's
    # deadline and kill end it. The next call takes the first idle worker that has started.
    for worker in list(rewards._POOL._idle):
        worker.wait_ready()
    stuck = rewards._POOL._idle[0]
    os.kill(stuck.pid, signal.SIGSTOP)
    try:
        metrics = Metrics()
        scores, elapsed = in_thread(make_accuracy_reward(BOUND), ["\\boxed{5}", "\\boxed{6}", "\\boxed{7}"],
                                    ["5", "6", "8"], log_metric=metrics)
        assert scores == [0.0, 1.0, 0.0]  # pair 1 is lost with the stuck worker, the rest go to the spare
        assert elapsed < BOUND + SLACK, f"{elapsed:.2f} s"
        assert metrics["accuracy_reward/timeouts"] == 1.0
        assert not alive(stuck.pid)
        assert stuck.pid not in rewards._POOL.pids()
    finally:
        if alive(stuck.pid):
            os.kill(stuck.pid, signal.SIGKILL)


def test_a_sigterm_to_the_workers_leaves_the_answers_to_the_parent(warm):
    """torchrun and accelerate launch end a training process with ``os.killpg(SIGTERM)``, and a scheduler signals every
    process of a job: the workers got it too and died, so the answers of the step a preempted trainer finishes (to
    checkpoint it) were lost and counted as timeouts. They are the parent's to answer for."""
    for worker in list(rewards._POOL._idle):
        worker.wait_ready()
    pids = rewards._POOL.pids()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.2)
    metrics = Metrics()
    scores, _ = in_thread(make_accuracy_reward(BOUND), ["\\boxed{5}", "\\boxed{6}", "\\boxed{7}"], ["5", "6", "8"],
                          log_metric=metrics)
    assert scores == [1.0, 1.0, 0.0]
    assert metrics["accuracy_reward/timeouts"] == 0.0
    assert all(alive(pid) for pid in pids) and set(pids) <= set(rewards._POOL.pids())


def test_workers_end_with_a_parent_ended_by_sigterm(tmp_path):
    """A parent ended by SIGTERM runs no atexit handler; its workers, which ignore SIGTERM, end on their closed pipe."""
    script = tmp_path / "child.py"
    script.write_text(rewards_alone("""
        import os, signal
        print(rewards.accuracy_reward(["\\\\boxed{3}"], ["3"]), flush=True)
        print(*rewards._POOL.pids(), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGTERM, out.stderr
    first, pids = out.stdout.splitlines()[:2]
    assert first == "[1.0]"
    pids = [int(p) for p in pids.split()]
    assert pids and all_end(pids)


def test_unscreened_slow_answers_cost_at_most_the_bound_each(warm):
    slow = ["\\boxed{9^{9^{9}}}", "\\boxed{2^{10^{9}}}", "\\boxed{(1+\\sqrt{2})^{100000}}"]
    reward, metrics = make_accuracy_reward(BOUND, prescreen=False), Metrics()
    scores, elapsed = in_thread(reward, [*slow, "\\boxed{4}"], ["4"] * 4, log_metric=metrics)
    assert scores == [0.0, 0.0, 0.0, 1.0]
    assert elapsed < len(slow) * BOUND + SLACK, f"{elapsed:.2f} s"
    assert metrics["accuracy_reward/timeouts"] == 3.0


def test_batch_of_256_adversarial_completions(warm):
    kinds = [
        (adversarial(), 1.0, 0),
        (TOWER, 0.0, 1),
        (boxed_loop(), 0.0, 1),
        (adversarial(final=""), 0.0, 0),
        ("\\boxed{2^{10^{9}}}", 0.0, 1),
        ("\\boxed{10000000!}", 0.0, 1),
        (adversarial(final="\\boxed{41}"), 0.0, 0),
        ([{"role": "assistant", "content": adversarial(final=TOWER)}], 0.0, 1),
    ]
    batch = [kinds[i % len(kinds)] for i in range(256)]
    reward, metrics = make_accuracy_reward(BOUND), Metrics()
    scores, elapsed = in_thread(reward, [c for c, _, _ in batch], ["42"] * 256, log_metric=metrics)
    assert scores == [s for _, s, _ in batch]
    assert metrics["accuracy_reward/timeouts"] == sum(t for _, _, t in batch) == 160
    assert elapsed < 256 * BOUND  # the guarantee
    assert elapsed < 20, f"{elapsed:.2f} s: the pre-screen should make these cost microseconds, not the bound"


def test_a_timed_out_completion_is_not_logged(warm, caplog, capfd):
    canary = "CANARY-TEXT-31337"
    completions = [f"{canary} reasoning \\boxed{{9^{{9^{{9}}}} + {canary}}}", f"{canary} \\boxed{{{canary}}}"]
    caplog.set_level(logging.DEBUG)
    for screen in (False, True):
        metrics = Metrics()
        scores, _ = in_thread(make_accuracy_reward(BOUND, prescreen=screen), completions, ["3", "3"],
                              log_metric=metrics)
        assert scores == [0.0, 0.0]
        assert metrics["accuracy_reward/timeouts"] == 1.0
    assert "time bound" in caplog.text  # the timeouts are reported...
    out, err = capfd.readouterr()
    assert canary not in caplog.text + out + err  # ...by count and length, never by text


def test_concurrent_calls_from_threads(warm):
    def score(k):
        completions = [f"step {k}: \\boxed{{{k * 10 + j}}}" for j in range(10)]
        results[k] = rewards.accuracy_reward(completions, [str(k * 10 + j + j % 2) for j in range(10)])

    results, threads = {}, []
    for k in range(4):
        thread = threading.Thread(target=score, args=(k,))
        threads.append(thread)
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {k: [1.0, 0.0] * 5 for k in range(4)}


def test_make_accuracy_reward_api():
    reward = make_accuracy_reward(3)
    assert reward.__name__ == "accuracy_reward" and reward.timeout_seconds == 3.0 and reward.prescreen
    assert make_accuracy_reward(name="acc_fast").__name__ == "acc_fast"
    assert pickle.loads(pickle.dumps(reward)).timeout_seconds == 3.0
    assert vars(reward) == {"timeout_seconds": 3.0, "prescreen": True, "__name__": "accuracy_reward"}  # JSON
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive"):
            make_accuracy_reward(bad)
    assert rewards._timeout_from_env({}) == 5.0
    assert rewards._timeout_from_env({"TRL_VARIANTS_REWARD_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "-3", "soon", "inf"):
        with pytest.raises(ValueError, match="TRL_VARIANTS_REWARD_TIMEOUT"):
            rewards._timeout_from_env({"TRL_VARIANTS_REWARD_TIMEOUT": bad})
    with pytest.raises(ValueError, match="2 completions but 1 solutions"):
        reward(["a", "b"], ["1"])


def test_workers_do_not_outlive_the_interpreter(tmp_path):
    # A fresh interpreter (rewards.py alone, no torch) scores from a non-main thread, leaves a worker busy on
    # a 60 s answer, and exits: its atexit handler must kill the workers, busy one included.
    script = tmp_path / "child.py"
    script.write_text(rewards_alone("""
        import sys, threading, time
        slow = rewards.make_accuracy_reward(60, prescreen=False)
        scored = threading.Event()
        def score():
            print(rewards.accuracy_reward(["\\\\boxed{3}"], ["3"]), flush=True)
            scored.set()
            slow(["\\\\boxed{(1+\\\\sqrt{2})^{100000}}"], ["3"])
        threading.Thread(target=score, daemon=True).start()
        assert scored.wait(60)
        time.sleep(0.5)  # the slow answer is in the worker now
        print(*rewards._POOL.pids(), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, pids = out.stdout.splitlines()[:2]
    assert first == "[1.0]"
    pids = [int(p) for p in pids.split()]
    assert len(pids) == 2  # the busy worker and the spare
    assert all_end(pids)
