"""Extra trainer state saved in every checkpoint and restored on resume (the way GRPOTrainer keeps its adaptive
entropy controller): a JSON file ``trl_variants_state.json`` beside the optimizer state."""

from __future__ import annotations

import json
import os

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

STATE_FILE = "trl_variants_state.json"


class CheckpointStateMixin:
    """Mix into a GRPOTrainer subclass and implement ``_extra_state`` / ``_load_extra_state``."""

    def _extra_state(self) -> dict:
        raise NotImplementedError

    def _load_extra_state(self, state: dict) -> None:
        raise NotImplementedError

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump(self._extra_state(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            path = os.path.join(checkpoint, STATE_FILE)
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path} is missing: the checkpoint was not written by {type(self).__name__}, so its algorithm "
                    "state cannot be restored. Resume from a checkpoint of the same trainer."
                )
            with open(path) as f:
                self._load_extra_state(json.load(f))
