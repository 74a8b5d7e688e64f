"""router/ never imports torch (nor transformers' AutoTokenizer, which would)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import kvmesh.router


def test_every_router_module_imports_without_torch():
    modules = [m.name for m in pkgutil.walk_packages(kvmesh.router.__path__, "kvmesh.router.")]
    assert "kvmesh.router.server" in modules and "kvmesh.router.policies.cache_aware" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import kvmesh.cluster.commands.router, kvmesh.cluster.benchmarks.router\n"
        "import kvmesh.replica.tokenizer, kvmesh.replica.protocol\n"
        "bad = [m for m in ('torch', 'transformers.models.auto.tokenization_auto') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
