"""The worker processes that run math-verify for :mod:`trl_variants.rewards` with a time bound per completion
(docs/reliability.md, "Reward time bound"); private: the reward functions and their public names are in
``rewards.py``.

A worker is ``python -c`` started with ``subprocess`` (fork+exec, safe in a process with threads) that loads this
file alone, by its path, with the parent's ``sys.path``: not the package, so no torch import. This module therefore
imports the standard library only (math-verify lazily, in :func:`_verify_pair`).

Worker side: :func:`_worker_main` reads ``(timeout, pairs)`` and answers each pair as soon as it is scored,
interrupting Python-level work with an alarm at ``_SOFT_FRACTION`` of the bound. Parent side: :class:`_Pool` keeps
idle workers (and one warm spare) shared by every thread, kills a worker that has not answered within the bound
(C-level work that never returns to the interpreter) and hands the remaining pairs to a fresh one; the workers are
killed at interpreter exit, and a forked child starts its own.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import subprocess
import sys
import threading
from functools import lru_cache

# The worker interrupts Python-level work at this fraction of the bound (the worker survives); the parent
# kills a worker that has not answered at the full bound (C-level work that never returns to the interpreter).
_SOFT_FRACTION = 0.8
_STARTUP_TIMEOUT = 120.0  # seconds a new worker may take to import math-verify before the call fails
_MAX_IDLE_WORKERS = 4


# --- math-verify, in the worker process --------------------------------------------------------------------


@lru_cache(maxsize=65536)
def _parse_gold_latex(latex: str, timeout):
    from math_verify import parse

    return parse(latex, parsing_timeout=timeout)


def _verify_pair(gold_latex: str, pred_latex: str, timeout=None) -> float:
    """1.0 when math-verify finds the two boxed answers equal. ``timeout``: math-verify's own (signal-based,
    main thread only) timeouts; None in the worker, which bounds time itself."""
    from math_verify import parse, verify

    gold = _parse_gold_latex(gold_latex, timeout)
    pred = parse(pred_latex, parsing_timeout=timeout)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=timeout))


class _SoftTimeout(BaseException):
    """Raised by the worker's alarm; a BaseException so that sympy's and math-verify's ``except Exception`` do
    not swallow it."""


def _limit_cpu(seconds: float) -> None:
    """Backstop for an orphaned worker stuck in C code: the kernel ends it after ``seconds`` more CPU time."""
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        soft = int(usage.ru_utime + usage.ru_stime + seconds) + 2
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ImportError, OSError, ValueError):
        pass


def _worker_main() -> None:
    """The worker's loop: read ``(timeout, [(gold_latex, pred_latex), ...])`` on stdin, answer each pair on
    the original stdout as soon as it is scored (1.0, 0.0, or None when interrupted at the soft deadline)."""
    import signal
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # and so is a job's SIGTERM: torchrun / accelerate launch end a worker with os.killpg (a scheduler signals every
    # process of the job), which reached these workers too; the answers of the step under way were then lost and
    # scored as timeouts while the trainer finished that step to checkpoint it (enable_jit_checkpoint). A worker
    # still ends when the parent does (EOF on its pipe), when the parent kills it (SIGKILL), or at its CPU limit.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # nothing math-verify or sympy prints (answers included) reaches a log or the pipe
    os.dup2(devnull, 2)
    reader, writer = Connection(0, writable=False), Connection(out, readable=False)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a worker ended by RLIMIT_CPU leaves no core file
    except (ImportError, OSError, ValueError):
        pass
    try:
        logging.disable(logging.CRITICAL)
        _verify_pair("\\boxed{1}", "\\boxed{1}")  # imports math-verify and builds its regexes
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        writer.send(("error", f"{type(e).__name__}: {e}"))
        return
    writer.send(("ready", os.getpid()))

    def alarm(signum, frame):
        raise _SoftTimeout

    signal.signal(signal.SIGALRM, alarm)
    while True:
        try:
            timeout, tasks = reader.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        for gold_latex, pred_latex in tasks:
            _limit_cpu(timeout)
            try:
                signal.setitimer(signal.ITIMER_REAL, _SOFT_FRACTION * timeout)
                try:
                    result = _verify_pair(gold_latex, pred_latex)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _SoftTimeout:
                result = None
            except Exception:  # noqa: BLE001 - malformed output scores 0
                result = 0.0
            writer.send(result)


# Runs this file as a standalone module (not the package: no torch import) with the parent's sys.path.
_WORKER_BOOT = (
    "import importlib.util, json, sys\n"
    "sys.path[:] = json.loads(sys.argv[2])\n"
    "if hasattr(sys, 'set_int_max_str_digits'): sys.set_int_max_str_digits(int(sys.argv[3]))\n"
    "spec = importlib.util.spec_from_file_location('_trl_variants_reward_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module._worker_main()\n"
)


# --- the worker processes, from the parent -----------------------------------------------------------------


class _Worker:
    """One worker process (``subprocess``: fork+exec, safe in a process with threads) and its two pipes."""

    def __init__(self):
        from multiprocessing.connection import Connection

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
        path = json.dumps([p for p in sys.path if isinstance(p, str)])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOT, os.path.abspath(__file__), path, str(digits)],
                stdin=to_child_r, stdout=from_child_w, stderr=subprocess.DEVNULL, close_fds=True,
            )
        except BaseException:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(from_child_r, writable=False)
        self.ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def started(self) -> bool:
        """Its start message is waiting (``wait_ready`` will not block)."""
        return self._recv.poll(0)

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self._recv.poll(_STARTUP_TIMEOUT):
            self.kill()
            raise RuntimeError(f"the reward worker did not start within {_STARTUP_TIMEOUT:.0f} s")
        try:
            kind, detail = self._recv.recv()
        except (EOFError, OSError):
            self.kill()
            raise RuntimeError(f"the reward worker exited at start (exit code {self.proc.poll()})") from None
        if kind != "ready":
            self.kill()
            raise RuntimeError(f"the reward worker could not start: {detail}")
        self.ready = True

    def send(self, message) -> None:
        self._send.send(message)

    def result(self, timeout: float):
        """``("ok", value)`` for the next answer, ``("timeout", None)`` when none came within ``timeout``
        seconds, ``("dead", None)`` when the worker died."""
        if not self._recv.poll(max(timeout, 0.0)):
            return "timeout", None
        try:
            return "ok", self._recv.recv()
        except (EOFError, OSError):
            return "dead", None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        self._send.close()
        self._recv.close()


class _Pool:
    """Worker processes shared by every thread: a call takes an idle worker (or starts one), and one more
    idle, warm worker is kept so that replacing a killed worker does not wait for an import."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._closed = False

    def _start(self) -> _Worker:  # with self._lock held
        if self._closed:
            raise RuntimeError("the reward workers are shut down (interpreter exit)")
        worker = _Worker()
        self._live.add(worker)
        return worker

    def _acquire(self) -> _Worker:
        with self._lock:
            for dead in [w for w in self._idle if not w.alive()]:
                self._idle.remove(dead)
                self._live.discard(dead)
                dead.kill()
            # a worker that has finished its start first (a spare may still be importing)
            worker = next((w for w in self._idle if w.ready or w.started()), self._idle[0] if self._idle else None)
            if worker is not None:
                self._idle.remove(worker)
            else:
                worker = self._start()
            if not self._idle:
                self._idle.append(self._start())  # the warm spare
        try:
            worker.wait_ready()
        except BaseException:
            self._discard(worker)
            raise
        return worker

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._live and len(self._idle) < _MAX_IDLE_WORKERS and worker.alive():
                self._idle.append(worker)
                return
        self._discard(worker)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._live.discard(worker)
        worker.kill()

    def run(self, tasks: list[tuple[str, str]], timeout: float) -> list[float | None]:
        """Score ``(gold_latex, pred_latex)`` pairs in order; None for a pair that exceeded ``timeout``
        seconds (or whose worker died). Each pair waits at most ``timeout`` seconds for its answer."""
        results: list[float | None] = [None] * len(tasks)
        i = 0
        worker = self._acquire()
        try:
            while i < len(tasks):
                try:
                    worker.send((timeout, tasks[i:]))
                except OSError:  # died since its last use: this pair is lost with it
                    i += 1
                    self._discard(worker)
                    worker = self._acquire()
                    continue
                while i < len(tasks):
                    status, value = worker.result(timeout)
                    if status == "ok":
                        results[i] = value
                        i += 1
                        continue
                    i += 1  # timed out or died: scored None, the rest go to a fresh worker
                    self._discard(worker)
                    worker = self._acquire()
                    break
        except BaseException:
            self._discard(worker)  # it may still be working on this call's pairs
            raise
        self._release(worker)
        return results

    def shutdown(self, final: bool = False) -> None:
        with self._lock:
            workers, self._live, self._idle = list(self._live), set(), []
            self._closed = self._closed or final
        for worker in workers:
            worker.kill()

    def forget_after_fork(self) -> None:
        """In a forked child: the workers belong to the parent; close this process's copies of their pipes."""
        self._lock = threading.Lock()
        for worker in self._live:
            worker.close()
            _ABANDONED.append(worker)  # never garbage-collected here: a Popen finalizer would wait for them
        self._live, self._idle = set(), []

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(w.pid for w in self._live)


_POOL = _Pool()
_ABANDONED: list[_Worker] = []
atexit.register(_POOL.shutdown, True)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.forget_after_fork)


def shutdown_reward_workers() -> None:
    """Kill the reward worker processes now (they also die at interpreter exit); a later call starts new
    ones."""
    _POOL.shutdown()


def verify_pairs(tasks: list[tuple[str, str]], timeout: float) -> list[float | None]:
    """Score ``(gold_latex, pred_latex)`` pairs with math-verify, each bounded by ``timeout`` seconds: 1.0 or 0.0,
    None for a pair that exceeded the bound. In a worker process on POSIX; elsewhere in this process with
    math-verify's own timeouts (main thread only)."""
    if os.name != "posix":  # no worker: math-verify's own timeouts, main thread only
        limit = max(1, math.ceil(timeout)) if threading.current_thread() is threading.main_thread() else None
        return [_safe_verify(gold, pred, limit) for gold, pred in tasks]
    return _POOL.run(tasks, timeout)


def _safe_verify(gold_latex: str, pred_latex: str, timeout) -> float:
    try:
        return _verify_pair(gold_latex, pred_latex, timeout)
    except Exception:  # noqa: BLE001
        return 0.0
