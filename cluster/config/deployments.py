"""Several models from one ``kvmesh serve`` config file: the ``deployments`` section.

    deployments:
      models:
        - {model: /models/llama-8b, served_model_name: llama, num_replicas: 2, tensor_parallel_size: 2,
           adapters: {sql: /adapters/sql, chat: /adapters/chat}}
        - {model: embedded, served_model_name: tiny, num_replicas: 1, engine: {max_num_seqs: 64}}

Each deployment is one base model with its own replicas; one router serves them all (pools by ``"model"``). A
deployment's replicas run the ``engine`` section with the deployment's own fields on top (model, tensor
parallelism, its ``engine`` overrides, its adapters as ``lora_modules``), and the ``replicas`` section with its
count and GPU share. ``deployment_config`` gives that one-model view as a whole ``ServeConfig``, so each
deployment is checked (and started) exactly as a one-model cluster is. Without deployments (the default),
``engine.model`` and ``replicas.num_replicas`` are the one model, exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Protocol, TypeVar

from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.router.config import RouterConfig

EngineSetting = int | float | str | bool | None
"""A value of an engine field a deployment sets for its replicas (``engine: {max_num_seqs: 64}``)."""
OWN_FIELDS = ("model", "tensor_parallel_size", "lora_modules", "enable_lora")
"""Engine fields a deployment sets through its own fields (model, tensor_parallel_size, adapters)."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """One base model of the cluster: its replicas, their parallelism and GPU share, its LoRA adapters."""

    model: str
    """Model path or Hugging Face directory of its replicas (``embedded``: the tiny built-in Llama)."""
    served_model_name: str | None = None
    """The name requests give as "model" (None: the model as given); names the deployment in kvmesh commands."""
    num_replicas: int = 1
    """Replicas of this model."""
    tensor_parallel_size: int = 1
    """Workers per replica (all on one node)."""
    gpus_per_replica: float | None = None
    """GPUs one replica holds on CUDA (a fraction packs replicas on a card); None: a GPU per worker."""
    adapters: dict[str, str] = field(default_factory=dict)
    """LoRA adapters its replicas serve from the start, name -> PEFT directory (vLLM's --lora-modules)."""
    engine: dict[str, EngineSetting] = field(default_factory=dict)
    """Engine settings of its replicas that differ from the engine section (max_loras, max_num_seqs, dtype...)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("deployments.models: every deployment needs a model (a path, a Hugging Face "
                             "directory or 'embedded')")
        if self.num_replicas < 1 or self.tensor_parallel_size < 1:
            raise ValueError(f"deployment {self.name}: num_replicas={self.num_replicas} and tensor_parallel_size="
                             f"{self.tensor_parallel_size} must be at least 1")
        if self.gpus_per_replica is not None and not self.gpus_per_replica > 0:
            raise ValueError(f"deployment {self.name}: gpus_per_replica={self.gpus_per_replica} must be > 0")
        known = {f.name for f in fields(EngineConfig)}
        for key in self.engine:
            if key in OWN_FIELDS:
                raise ValueError(f"deployment {self.name}: set {key} through the deployment's own fields "
                                 "(model, tensor_parallel_size, adapters), not its engine settings")
            if key not in known:
                raise ValueError(f"deployment {self.name}: engine.{key} is no engine setting")
        for name, path in self.adapters.items():
            if not name or not path:
                raise ValueError(f"deployment {self.name}: adapter {name!r}={path!r}: expected NAME: PEFT_DIR")

    @property
    def name(self) -> str:
        """The deployment's name: its served model name, else its model."""
        return self.served_model_name or self.model


@dataclass(frozen=True, slots=True)
class DeploymentsConfig:
    """Several models in one cluster; empty: the one model of the engine and replicas sections."""

    models: list[Deployment] = field(default_factory=list, metadata={"flag": "--deployment"})
    """Deployments (model, served_model_name, num_replicas, tensor_parallel_size, gpus_per_replica, adapters,
    engine), all behind the one router; placement is planned for all before any starts."""

    def __post_init__(self) -> None:
        names = [d.name for d in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"deployments.models: {', '.join(twice)} named twice; give each deployment its own "
                             "served_model_name")
        adapters = [a for d in self.models for a in d.adapters]
        clash = sorted({a for a in adapters if adapters.count(a) > 1 or a in names})
        if clash:
            raise ValueError(f"deployments.models: adapter name(s) {', '.join(clash)} used twice (a request's "
                             "\"model\" must name one base model or adapter)")

    def named(self, name: str) -> Deployment:
        """The deployment called ``name`` (ValueError listing them otherwise)."""
        for d in self.models:
            if d.name == name:
                return d
        raise ValueError(f"no deployment {name!r}; the deployments: {', '.join(d.name for d in self.models) or 'none'}")


class _Replicas(Protocol):
    num_prefill_replicas: int


class ServeTree(Protocol):
    """What this module reads of ``ServeConfig`` (cluster/config/trees.py, which imports this module)."""

    engine: EngineConfig
    replicas: _Replicas
    router: RouterConfig
    autoscale: AutoscaleConfig
    deployments: DeploymentsConfig


ServeConfig = TypeVar("ServeConfig", bound=ServeTree)
"""``trees.ServeConfig`` (a type variable: the tree is built from this module's section, not the other way)."""


def lora_engine_fields(adapters: dict[str, str]) -> dict[str, object]:
    """The engine fields that serve ``adapters`` from the start (none without adapters)."""
    if not adapters:
        return {}
    known = {f.name for f in fields(EngineConfig)}
    if "lora_modules" not in known:
        raise ValueError("deployments with adapters need an engine that serves LoRA (engine.enable_lora, "
                         "engine.lora_modules); this kvmesh has none")
    return {"enable_lora": True, "lora_modules": dict(adapters)}


def deployment_config(config: ServeConfig, deployment: Deployment) -> ServeConfig:
    """``config`` as a one-model cluster of ``deployment``: its model, parallelism, engine settings and adapters
    on the engine section, its count and GPU share on the replicas section, its served name on the router's."""
    engine = replace(config.engine, model=deployment.model, tensor_parallel_size=deployment.tensor_parallel_size,
                     **deployment.engine, **lora_engine_fields(deployment.adapters))
    replicas = replace(config.replicas, num_replicas=deployment.num_replicas, num_prefill_replicas=0,
                       gpus_per_replica=deployment.gpus_per_replica)
    router = replace(config.router, served_model_name=deployment.served_model_name)
    return replace(config, engine=engine, replicas=replicas, router=router, deployments=DeploymentsConfig())


def check_deployments(config: ServeConfig) -> None:
    """Each deployment is a valid one-model cluster (its engine, GPU share, ports); the cluster-wide settings that
    a deployment cannot take yet (prefill replicas, autoscaling) are off."""
    if not config.deployments.models:
        return
    if config.replicas.num_prefill_replicas:
        raise ValueError("deployments: replicas.num_prefill_replicas must be 0 (a prefill/decode split of several "
                         "models is not supported)")
    if config.autoscale.scale_with_load:
        raise ValueError("deployments: autoscale.scale_with_load must be off (scale each deployment with "
                         "`kvmesh scale N --deployment NAME`)")
    sizes = {}
    for d in config.deployments.models:
        try:
            sizes[d.name] = deployment_config(config, d).engine.block_size
        except ValueError as e:
            raise ValueError(f"deployment {d.name}: {e}") from None
    if len(set(sizes.values())) > 1:  # the one router keys every model's blocks with one block size
        raise ValueError("deployments: every deployment needs the same engine.block_size (the router hashes "
                         f"blocks of one size); got {', '.join(f'{n}: {b}' for n, b in sizes.items())}")
