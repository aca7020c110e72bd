"""A trainer attribute that lives on one of its parts (:class:`PartAttribute`)."""

from __future__ import annotations


class PartAttribute:
    """A trainer attribute that reads and sets an attribute of one of its parts: ``_pef_pos = PartAttribute(
    "dph_rehearsal", "pef_pos")`` on a trainer class makes ``trainer._pef_pos`` the rehearsal part's ``pef_pos``. The
    state stays with the part (checkpointed by it); code that reaches it through the trainer keeps working."""

    def __init__(self, part_name: str, attribute: str):
        self.part_name, self.attribute = part_name, attribute

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def _part(self, trainer):
        return next((p for p in getattr(trainer, "parts", ()) if p.name == self.part_name), None)

    def __get__(self, trainer, owner=None):
        if trainer is None:
            return self
        part = self._part(trainer)
        if part is not None:
            return getattr(part, self.attribute)
        if self.name in trainer.__dict__:  # set on a trainer without the part: a plain attribute, as before
            return trainer.__dict__[self.name]
        # an AttributeError: hasattr(trainer, ...) is False on a trainer without the part
        raise AttributeError(f"{type(trainer).__name__} has no part {self.part_name!r}, which holds {self.attribute!r}")

    def __set__(self, trainer, value) -> None:
        part = self._part(trainer)
        if part is None:
            trainer.__dict__[self.name] = value
        else:
            setattr(part, self.attribute, value)
