"""The part of docs/parts.md ("A part of your own"), run as the doc writes it: its first Python block, executed."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "parts.md"


def doc_example_source() -> str:
    """The first ```python block of the section "A part of your own"."""
    section = DOC.read_text().split("\n## A part of your own\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"^```python\n(.*?)^```", section, re.M | re.S).group(1)


def doc_example() -> dict:
    """The block's names (``SelfImitation``), executed as the module ``parts_doc_example``."""
    namespace = {"__name__": "parts_doc_example"}
    exec(compile(doc_example_source(), str(DOC), "exec"), namespace)
    return namespace
