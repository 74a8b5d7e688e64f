"""What ``kvmesh serve`` hands its router: the serve config's router section, composed with what the router takes
from the rest of the cluster (the counterpart of replica_sections.py for the router).

    ServeConfig.router ──▶ RouterConfig   the host serve resolved, the model and tokenizer the replicas load, the
                                          engine's block size, context and step budget (the policy's), every served
                                          name, the embedded model's chat frontend, the cluster's internal key and
                                          admin key, the salt secret derived from the hash seed (never the seed),
                                          and the CURVE keys of private event streams
"""

from __future__ import annotations

from dataclasses import replace

from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.launch import ray_cluster
from kvmesh.cluster.launch.embedded_model import served_frontend
from kvmesh.cluster.launch.event_keys import CurveKeys
from kvmesh.cluster.launch.serve_state import ServeState
from kvmesh.kvcache.hashing import cache_salt_secret
from kvmesh.replica.config import EngineConfig
from kvmesh.router.config import RouterConfig
from kvmesh.router.routing.policies import with_step_budget


def router_section(cfg: ServeConfig, st: ServeState, engine: EngineConfig, *, several_models: bool,
                   internal_key: str, hash_seed: str, curve: CurveKeys | None,
                   admin_key: str | None = None) -> RouterConfig:
    """The router's config as serve starts it. ``engine`` is the engine section of the router's own model (a
    deployments cluster's first deployment's); ``several_models``: the cluster serves deployments, not one model."""
    router = replace(cfg.router, host=ray_cluster.router_host(cfg, st.ray), model=st.model_path,
                     policy_kwargs=with_step_budget(cfg.router.policy, cfg.router.policy_kwargs,
                                                    engine.max_num_batched_tokens),
                     tokenizer=engine.tokenizer, served_model_name=served_names(cfg, st, several_models),
                     max_model_len=engine.max_model_len, block_size=engine.block_size,
                     upstream=replace(cfg.router.upstream, replica_api_key=None), internal_key=internal_key,
                     admin_key=admin_key, frontend=served_frontend(cfg.frontend, cfg.engine.model),
                     cache_salt_secret=cache_salt_secret(hash_seed))
    return curve.router(router) if curve else router


def served_names(cfg: ServeConfig, st: ServeState, several_models: bool) -> str | list[str]:
    """The names the router accepts for its own model: every ``--served-model-name`` (vLLM's aliases), the first
    reported; a deployments cluster's first deployment's name."""
    names = cfg.router.served_names()
    return list(names) if not several_models and len(names) > 1 else st.served_model_name
