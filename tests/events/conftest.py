"""Makes ``events_testkit`` (shared builders of the events tests) importable under importlib mode."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
