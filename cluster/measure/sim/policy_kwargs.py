"""The routing policies' keyword arguments a simulation is given (``--policy-kwargs K=V``): their values and the check
that each names an option of some policy."""

from __future__ import annotations

PolicyArgument = int | float | str | bool | None
"""A routing policy's keyword argument value, as given on the command line (``--policy-kwargs K=V``)."""


def check_policy_kwargs(options: dict[str, PolicyArgument]) -> None:
    """Every knob is one of some policy's (``--policy-kwargs`` tunes all the policies compared)."""
    from kvmesh.cluster.measure.sim.rivals import COMPARED
    from kvmesh.router.routing.policies import policy_options

    known = sorted({name for policy in COMPARED for name in policy_options(policy, COMPARED)})
    for key in options:
        if key not in known:
            raise ValueError(f"policy_kwargs: {key!r} is an option of no routing policy; "
                             f"the options: {', '.join(known)}")
