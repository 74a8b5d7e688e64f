"""On a GPU (skipped without CUDA): two replicas at gpus_per_replica 0.5 share one card through the real
serve path -- Ray reserves half a GPU each, each engine runs at 0.9 x 0.5 of the card's memory, the
second sizes its KV cache with the first one's memory already taken, and both answer."""

from __future__ import annotations

import os

import httpx
import pytest
from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.launch.launcher import ServeCluster

pytestmark = [pytest.mark.gpu, pytest.mark.ray, pytest.mark.slow]


def test_two_half_gpu_replicas_share_a_card_and_both_answer(ray_session, stories_path):
    import ray

    gpus = ray.cluster_resources().get("GPU", 0.0)
    if gpus < 1:
        pytest.skip("the session's Ray sees no GPU")
    config = from_dict({
        "engine": {"model": str(stories_path), "device": "cuda", "max_model_len": 256},
        "replicas": {"num_replicas": 2, "gpus_per_replica": 0.5, "max_restarts": 0, "http_port": 0,
                     "event_port": 0},
        "router": {"port": 0},
        "ray": {"namespace": f"kvmesh-gpu-share-{os.getpid()}", "ready_timeout_s": 300},
    })
    messages: list[str] = []
    cluster = ServeCluster(config, report=messages.append)
    try:
        cluster.start()
        assert cluster.state.engine.gpu_memory_utilization == pytest.approx(0.45)
        assert any("GPU': 0.5" in m and "gpu_memory_utilization 0.45 each" in m for m in messages), messages
        assert ray.available_resources().get("GPU", 0.0) == pytest.approx(gpus - 1.0)  # 2 x 0.5 reserved
        for handle in cluster.state.replicas:
            body = {"model": cluster.state.served_model_name, "prompt": "Once upon a time", "max_tokens": 8}
            response = httpx.post(handle.endpoints["http_url"] + "/v1/completions", json=body, timeout=60,
                                  headers={"Authorization": f"Bearer {cluster.router_config().internal_key}"})
            assert response.status_code == 200, response.text
    finally:
        cluster.stop()
