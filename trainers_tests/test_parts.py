"""trl_variants/parts.py without a model: a part's state seen through the trainer (``PartAttribute``) and the part
lookup. The trainers that use them are tested in their packages (dph/, eepo/, composed/)."""

import pytest

from trl_variants.parts import Part, PartAttribute


class Counter(Part):
    name = "counter"

    def __init__(self):
        self.position = 0

    def state(self) -> dict:
        return {"position": self.position}


class Holder:  # what PartAttribute reads of a trainer: its ``parts``
    position = PartAttribute("counter", "position")

    def __init__(self, parts):
        self.parts = parts


def test_the_state_lives_in_the_part_and_the_trainer_reads_and_sets_it():
    part = Counter()
    trainer = Holder([part])
    trainer.position = 7
    assert part.position == 7 and part.state() == {"position": 7}  # what the checkpoint keeps: the part's
    part.position = 3
    assert trainer.position == 3 and "position" not in trainer.__dict__


def test_without_the_part_the_attribute_is_absent_until_set():
    trainer = Holder([])
    assert not hasattr(trainer, "position")
    with pytest.raises(AttributeError, match="no part 'counter', which holds 'position'"):
        trainer.position  # noqa: B018
    trainer.position = 5  # a plain attribute then, as on any object
    assert trainer.position == 5
