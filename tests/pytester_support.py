"""For tests of this suite's own plugins (tests/tiers.py, tests/signal_guard.py) run in a pytester session."""

from __future__ import annotations

from pathlib import Path


def conftest_loading(path: Path, name: str) -> str:
    """Conftest source that loads the plugin file ``path`` by its path as the module ``name`` (the pytester session
    does not see this suite's package), so the source after it can use ``name``."""
    return f'''
import importlib.util
spec = importlib.util.spec_from_file_location("{name}_under_test", {str(path)!r})
{name} = importlib.util.module_from_spec(spec)
spec.loader.exec_module({name})
'''
