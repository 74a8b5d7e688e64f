"""The seeded combinations of request fields (field_combos.py) and the Responses attack's shots: the same seed draws
the same bodies, another seed others; each endpoint's fields are drawn; every shot is whole and has a unique name (a
failure names the one to replay)."""

from __future__ import annotations

from .field_combos import combos
from .hostile_fields import ENDPOINTS
from .shot_attacker import all_shots
from .stored_and_headers import Ids


def _drawn(seed: int) -> list[str]:
    """The combinations' names: each names its fields and values, which write its body."""
    return [shot.name for shot in combos(seed, 15)]


def test_a_seed_draws_the_same_combinations_and_another_seed_others():
    first = _drawn(1)
    assert first == _drawn(1)
    assert first != _drawn(2)


def test_every_endpoint_gets_combinations_of_several_fields():
    shots = combos(1, 15)
    for endpoint in ENDPOINTS:
        mine = [s for s in shots if s.path == endpoint.path]
        assert len(mine) == 15
        assert any(s.name.count(" = ") >= 3 for s in mine)


def test_every_shot_has_its_own_name_and_is_whole():
    shots = all_shots(Ids("resp_a", "resp_b", "resp_c", "resp_d"), 1, 15)
    names = [s.name for s in shots]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for shot in shots:
        assert shot.body is None or callable(shot.body), shot.name
        assert all(isinstance(k, str) and isinstance(v, (str, bytes)) for k, v in shot.headers), shot.name
