"""Run as a script: how many STRICT_PACK placement groups of each bundle list Ray itself places on a
one-node Ray with the given logical CPUs and GPUs (its own process; the caller compares with capacity.py).

    python ray_capacity_probe.py '{"CPU": 8, "GPU": 2}' '[[bundles, predicted], ...]'  ->  JSON list of counts
"""

from __future__ import annotations

import json
import sys


def placed(ray, bundles: list[dict[str, float]], predicted: int) -> int:
    """Ask for predicted + 1 groups; count those Ray places (the extra one gets 1.5 s to prove it cannot)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = [placement_group(bundles, strategy="STRICT_PACK") for _ in range(predicted + 1)]
    refs = [g.ready() for g in groups]
    ray.wait(refs, num_returns=predicted, timeout=30)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.5)
    for g in groups:
        remove_placement_group(g)
    return len(ready)


def main() -> None:
    import ray

    node, scenarios = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    ray.init(num_cpus=node["CPU"], num_gpus=node["GPU"], include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        print(json.dumps([placed(ray, bundles, predicted) for bundles, predicted in scenarios]))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
