"""Tests that share one set of options over several part lists pass each list only its own parts' options
(``ComposedConfig`` refuses an option of a part that does not run)."""

from trl_variants.composed.config import unselected_options


def options_for(parts, options: dict) -> dict:
    """``options`` without those of parts not in ``parts`` (ERPO's, DPH-RL's, EEPO's, dynamic sampling's)."""
    drop = set(unselected_options(options, list(parts)))
    return {k: v for k, v in options.items() if k not in drop}
