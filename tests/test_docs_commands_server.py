"""The guides' ``server`` blocks, run: their servers started in the background on free ports of 127.0.0.1, their
other commands run against them, readers checked to print an event, everything stopped at the end
(tests/docs_servers.py runs a block; tests/docs_commands.py has the markers).

A block that expects servers started beforehand (a router in front of replicas, a reader of a cluster's events)
gets them here, from a ``Recipe``: guide-style commands started first, the environment variables the block reads,
the PEFT adapters its ``/adapters/NAME`` paths name, the files it reads. Blocks without a recipe start their own.
"""

from __future__ import annotations

import re
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import SHARED_DIR, STORIES_HF
from .docs_commands import REPO, blocks, command_environment, scratch_layout
from .docs_servers import STOP_TIMEOUT_S, Ports, Session, serving_verb

BIN = Path(sys.executable).parent
ADAPTERS = re.compile(r"/adapters/([\w-]+)")


@dataclass(frozen=True)
class Recipe:
    match: str
    """Text of the block that picks this recipe."""
    before: tuple[str, ...] = ()
    """Servers the block expects running, as guide commands (started first; blocks with the same ones share them)."""
    variables: tuple[str, ...] = ()
    """Environment variables the block reads: each a fresh key."""
    adapters: str = ""
    """The base model of the PEFT adapters at ``/adapters/NAME`` (written by the test): stories or embedded."""
    files: dict[str, str] = field(default_factory=dict)
    """Files the block reads, written in its folder: name -> what to write (``yaml``: the guide's yaml block before
    it)."""
    after: dict | None = None
    """A completion sent through the router once the block ran; it must answer 200."""
    joins_previous: bool = False
    """The block runs with the guide's server block before it, which starts what it needs."""
    metric: str = ""
    """A line the router's ``/metrics`` has once ``after`` went through."""


RECIPES = (
    Recipe('sub.connect("tcp://127.0.0.1:5557")', before=("kvmesh serve --no-private-events",)),
    Recipe("kvmesh events tail --endpoint tcp://127.0.0.1:5557", before=("kvmesh serve --no-private-events",)),
    Recipe("role=prefill", joins_previous=True, after={"prompt": " ".join(["Once upon a time there was a dog"] * 40),
                                                       "max_tokens": 4},
           metric='kvmesh_router_pd_splits_total{outcome="ok"} 1.0'),
    Recipe('KVMESH_INTERNAL_KEY="$INTERNAL" kvmesh router', joins_previous=True, variables=("ADMIN", "INTERNAL"),
           adapters="embedded"),
    Recipe("--lora-modules tiny=/adapters/tiny", variables=("KVMESH_ADMIN_KEY",), adapters="stories"),
    Recipe("kvmesh serve --config fleet.yaml", adapters="stories", files={"fleet.yaml": "yaml"}),
)
SERVER_BLOCKS = [block for block in blocks() if block.kind == "server"]


def recipe(block) -> Recipe:
    found = [r for r in RECIPES if r.match in block.text]
    assert len(found) <= 1, f"{block.where}: several recipes match: {found}"
    return found[0] if found else Recipe("")


def groups() -> list[list]:
    """The server blocks, those of one guide with the same servers started beforehand together."""
    grouped: dict = {}
    for block in SERVER_BLOCKS:
        r = recipe(block)
        if r.joins_previous:
            last = list(grouped.values())[-1]
            assert last[-1].path == block.path, f"{block.where}: no server block before it in its guide"
            last.append(block)
            continue
        grouped.setdefault((block.path, r.before) if r.before else block.where, []).append(block)
    return list(grouped.values())


def merged(group: list) -> Recipe:
    """What the group's blocks need together (the servers started beforehand: its first's)."""
    rs = [recipe(block) for block in group]
    return Recipe(rs[0].match, before=rs[0].before, variables=tuple(v for r in rs for v in r.variables),
                  adapters=next((r.adapters for r in rs if r.adapters), ""),
                  files={k: v for r in rs for k, v in r.files.items()},
                  after=next((r.after for r in rs if r.after is not None), None),
                  metric=next((r.metric for r in rs if r.metric), ""))


def yaml_before(block) -> str:
    """The text of the last ```yaml block of the block's guide before it."""
    lines = (REPO / block.path).read_text().split("\n")[:block.line - 1]
    start = max(i for i, line in enumerate(lines) if line.strip() == "```yaml")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    return "\n".join(lines[start + 1:end]) + "\n"


def test_every_recipe_picks_one_server_block():
    for r in RECIPES:
        assert sum(r.match in block.text for block in SERVER_BLOCKS) == 1, f"recipe {r.match!r}"


def test_every_server_block_runs_a_server_or_has_one_started():
    for block in SERVER_BLOCKS:
        serving = "while True" in block.text or any(serving_verb(c) for c in block.commands())
        assert serving or recipe(block).before or recipe(block).joins_previous, \
            f"{block.where}: no server started for it: mark it run or live, or give it a recipe"


def test_guide_ports_move_with_their_family():
    ports = Ports(bases={8000: 30000, 8100: 31000, 5557: 32000})
    assert ports.rewrite("curl localhost:8000/v1 http://127.0.0.1:8101 tcp://127.0.0.1:5559 --port 8100 :80001") \
        == "curl localhost:30000/v1 http://127.0.0.1:31001 tcp://127.0.0.1:32002 --port 31000 :80001"
    assert ports.with_defaults("kvmesh serve --model m  # a comment") == \
        "kvmesh serve --model m --port 30000 --http-port 31000 --event-port 32000 # a comment"
    assert ports.with_defaults("kvmesh replica --port 31001 --event-port=1") == \
        "kvmesh replica --port 31001 --event-port=1 --replay-port 32001"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A folder laid out as the checkout, ../shared beside it; skips without curl or stories260K."""
    if shutil.which("curl") is None:
        pytest.skip("the guides' server blocks use curl, which this machine lacks")
    if not (STORIES_HF / "config.json").exists():
        pytest.skip(f"the guides' server blocks serve stories260K, not found at {STORIES_HF}")
    return scratch_layout(tmp_path_factory.mktemp("docs-servers"), SHARED_DIR)


def _adapters(r: Recipe, root: Path, cache: Path, texts: list[str]) -> None:
    """Write a PEFT adapter of the recipe's base at ``root/NAME`` for every ``/adapters/NAME`` of ``texts``."""
    from kvmesh.cluster.launch.embedded_model import embedded_model_files, materialize
    from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter

    base = STORIES_HF if r.adapters == "stories" else Path(materialize(embedded_model_files(), root=cache))
    for seed, name in enumerate(sorted({n for text in texts for n in ADAPTERS.findall(text)})):
        write_lora_adapter(base, root / name, seed=seed)


def _session(group: list, workspace: Path, tmp: Path) -> Session:
    r = merged(group)
    env = command_environment(BIN, KVMESH_CLUSTERS_DIR=str(tmp / "clusters"),
                              KVMESH_CACHE_DIR=str(workspace.parent / "cache"),
                              KVMESH_RESULTS_DIR=str(tmp / "results"),
                              **{name: secrets.token_hex(16) for name in r.variables})
    env.pop("RAY_ADDRESS", None)
    (tmp / "logs").mkdir()
    session = Session(workspace, env, tmp / "logs")
    texts = [b.text for b in group] + [yaml_before(group[0]) for what in r.files.values() if what == "yaml"]
    if r.adapters:
        _adapters(r, tmp / "adapters", workspace.parent / "cache", texts)
        session.replace["/adapters/"] = f"{tmp}/adapters/"
    for name, what in r.files.items():
        (tmp / name).write_text(session.substitute(yaml_before(group[0]) if what == "yaml" else what))
        session.replace[name] = str(tmp / name)
    return session


@pytest.mark.live  # kvmesh serve, replica and router on ports of 127.0.0.1 (tests/tiers.py)
@pytest.mark.timeout(600)  # a group runs several commands (a fleet's scale and rolling restart), each bounded alone
@pytest.mark.parametrize("group", groups(), ids=lambda g: "+".join(b.where for b in g))
def test_server_blocks(group, workspace, tmp_path):
    """The blocks' servers start and become ready, their other commands exit 0 (curl: a 2xx), their readers
    print a stored block once requests go through, and everything stops."""
    r = merged(group)
    session = _session(group, workspace, tmp_path)
    try:
        for command in r.before:
            command = session.prepare(command)
            session.launch(command, serving_verb(command), f"{group[0].where} (started beforehand)")
        for block in group:
            session.run_block(block)
        session.await_events(group[0].where)
        if r.after is not None:
            answer = session.complete(r.after)
            assert answer.status_code == 200, f"{group[0].where}: a request through the router: {answer.text[:500]}"
        if r.metric:
            assert r.metric in session.metrics(), f"{group[0].where}: the router's /metrics lacks {r.metric}"
    finally:
        killed = session.close()
    assert not killed, f"{group[0].where}: Ctrl-C did not stop {killed} in {STOP_TIMEOUT_S}s (killed)"
