"""Resume: an evaluation's finished chunks appended to a JSON-lines results file (:class:`ResultsFile`) whose header
holds the run's key (:func:`run_key`: model, weights, dataset, options, library versions); a rerun with the same key
reads them back, another key is refused naming what differs."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from ..presample.cache import model_signature
from ..presample.reward_calls import RewardModelReward, reward_fingerprint, reward_name
from .config import EvalConfig


def _normalized(obj):
    return json.loads(json.dumps(obj))


def _weights_id(model) -> dict:
    """Which weights ``model`` holds (:func:`~trl_variants.presample.cache.model_signature` at their own dtype)."""
    dtype = model_signature(model, dtypes=())["dtype"]
    signature = model_signature(model, dtypes=(dtype,) if dtype else ())
    return {"dtype": dtype, "hash": signature["hashes"].get(dtype)}


def _dataset_hash(dataset, prompt_ids) -> dict:
    h = hashlib.sha256()
    for batch in dataset.iter(batch_size=1000):
        h.update(json.dumps(batch, sort_keys=True, default=str).encode())
    ids = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]
    return {"rows": len(dataset), "content": h.hexdigest()[:16], "prompt_ids": ids}


def _reward_id(func) -> list:
    """A reward function in a results file's key: its name and code fingerprint (a reward model: and its weights)."""
    model = getattr(func, "model", None) if isinstance(func, RewardModelReward) else None
    return [reward_name(func), reward_fingerprint(func)] + ([_weights_id(model)] if model is not None else [])


def run_key(model, dataset, prompt_ids, reward_funcs, config: EvalConfig, backend: str, reference_model=None,
            correctness: int = 0) -> dict:
    """Everything an evaluation's numbers depend on, as a flat dict (stored in a results file's header): the model
    (path and weights), the dataset (content and prompt token ids, which cover the tokenizer and chat template),
    the reward functions and the one that decides correctness (``reward_funcs[correctness]``), the options, the
    backend and the library versions."""
    from importlib import metadata

    key = {**config.key_options(),
           "model": str(getattr(model.config, "_name_or_path", "")), "model_weights": _weights_id(model),
           "dataset": _dataset_hash(dataset, prompt_ids),
           "reward_funcs": [_reward_id(f) for f in reward_funcs],
           "correctness_func": [correctness, *_reward_id(reward_funcs[correctness])],
           "reference_model": None if reference_model is None else {
               "model": str(getattr(reference_model.config, "_name_or_path", "")),
               "weights": _weights_id(reference_model)},
           "backend": backend,
           "versions": {pkg: metadata.version(pkg) for pkg in ("torch", "transformers", "trl-variants")}}
    return _normalized(key)


def legacy_key(key: dict) -> dict | None:
    """The key an evaluation with ``key`` had before correctness was decided by one function (earlier versions
    counted a sample correct when the sum of every reward was > 0), when that rule gives the same numbers: one reward
    function only (then the sum is that function). None otherwise."""
    if len(key["reward_funcs"]) != 1:
        return None
    return {k: v for k, v in key.items() if k != "correctness_func"}


def _describe_differences(old: dict, new: dict) -> str:
    diffs = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            diffs.append(f"{name}: {json.dumps(old.get(name))} in the file, {json.dumps(new.get(name))} now")
    return "; ".join(diffs)


class ResultsFile:
    """Finished chunks of one evaluation as JSON lines: a header ``{"kind": "header", "key": ...}`` and one
    ``{"kind": "chunk", "pass": ..., "chunk": ..., ...}`` line per chunk, appended (and flushed to disk) as each
    finishes. Opening reads the finished chunks back when the header's key equals ``key``; another key is refused,
    naming what differs, unless ``restart`` (then the file is started over). A last line cut by an interruption is
    dropped. Only the ``writer`` (the main process) writes. A file written before correctness was decided by one
    function is read when its rule gave the same numbers (:func:`legacy_key`), refused otherwise."""

    def __init__(self, path, key: dict, restart: bool = False, writer: bool = True):
        self.path, self.key, self.writer = Path(path), key, writer
        self.accepted = [key] + ([legacy_key(key)] if "correctness_func" in key and legacy_key(key) else [])
        self.done: dict[tuple[str, int], dict] = {}
        self._valid_bytes = 0  # the length of the readable part (a cut last line is dropped)
        self._fresh = restart or not self.path.exists() or self.path.stat().st_size == 0
        if not self._fresh:
            self._read()

    def _read(self):
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        complete = lines[:-1]  # everything before the last newline; what follows it is a cut line (or nothing)
        if lines[-1].strip():
            warnings.warn(f"{self.path}: the last line was cut (an interrupted write); that chunk is computed again",
                          stacklevel=3)
        try:
            header = json.loads(complete[0]) if complete else None
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("kind") != "header":
            raise ValueError(f"{self.path} is not an evaluation results file (no header line): remove it, choose "
                             "another output directory, or restart (--restart true / restart=True) to overwrite it")
        stripped = {k: v for k, v in self.key.items() if k != "correctness_func"}
        if header["key"] not in self.accepted and header["key"] == stripped:  # only the correctness rule differs
            funcs = [f[0] for f in header["key"].get("reward_funcs") or []]
            raise ValueError(f"{self.path} was written by an earlier version of evaluate, which counted a sample "
                             f"correct when the sum of all its rewards ({', '.join(funcs)}) was > 0; now only "
                             f"{self.key['correctness_func'][1]} decides, and the others are reported beside it. "
                             "Restart (--restart true / restart=True) to evaluate again under this rule, or choose "
                             "another output directory")
        if header["key"] not in self.accepted:
            differences = _describe_differences(header["key"], self.key)
            raise ValueError(f"{self.path} holds the results of another evaluation ({differences}). Rerun with the "
                             "same model and options to resume it, choose another output directory, or restart "
                             "(--restart true / restart=True) to discard it and start over")
        for record in chunk_records(self.path, complete):
            self.done.setdefault((record["pass"], record["chunk"]), record)
        self._valid_bytes = sum(len(line) + 1 for line in complete)

    @staticmethod
    def check(path) -> None:
        """Refuse, naming the file, the line and the fix, a results file whose finished chunks cannot be read back (a
        damaged line before the last one): ``trl-variants evaluate`` runs it before any model loads. A missing or
        empty file, or a cut last line (an interrupted write, computed again), passes."""
        path = Path(path)
        if path.is_file() and path.stat().st_size:
            chunk_records(path, path.read_bytes().split(b"\n")[:-1])

    def start(self) -> None:
        """Write the header of a new file, or cut a partly written last line off an old one (writer only)."""
        if not self.writer:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._fresh:
            self._write_lines([{"kind": "header", "key": self.key}], mode="w")
        elif self.path.stat().st_size != self._valid_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(self._valid_bytes)

    def append(self, record: dict) -> None:
        self.done.setdefault((record["pass"], record["chunk"]), record)
        if self.writer:
            self._write_lines([{"kind": "chunk", **record}], mode="a")

    def _write_lines(self, records, mode):
        with open(self.path, mode) as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())


def chunk_records(path, complete: list[bytes]) -> list[dict]:
    """The chunk records of a results file's complete lines (the header first, skipped), each checked: a line that is
    not a JSON chunk record is refused naming the file, its line number and the fix."""
    records = []
    for number, line in enumerate(complete[1:], start=2):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "pass" not in record or "chunk" not in record:
                raise ValueError("not a chunk record")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            shown = line[:60].decode("utf-8", "replace")
            raise ValueError(f"{path}, line {number}, is damaged ({e}; it starts {shown!r}): the finished chunks "
                             "after it cannot be trusted. Rerun with --restart true (restart=True) to evaluate this "
                             "model again from the start, or remove that file (or only its lines from line "
                             f"{number} on, to keep the chunks before it)") from None
        records.append(record)
    return records
