"""Starting or joining Ray, and what serve needs to know about the cluster it runs on.

Three cases:
- embedded (``ray.address`` unset): a local Ray instance on 127.0.0.1 with an explicit number of
  logical CPUs, owned by serve and shut down with it; every Ray listener (GCS, raylet, workers,
  agents, metrics export) binds 127.0.0.1, no Ray process inherits kvmesh's secrets, and Ray's
  processes run in a session of their own (a signal to serve's process group reaches serve, which
  stops them in order);
- join (``--address auto`` or host:port): the driver connects to an existing cluster and leaves it
  running on exit (only kvmesh's own actors and placement groups are removed);
- already initialized in this process (tests' ``ray_session``): used as is, never shut down.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from kvmesh.cluster.config.trees import ServeConfig

logger = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"
# logical CPUs left for the router actor, readiness probes and the supervisor's tasks
DRIVER_CPUS = 2
_RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's switch; "0": a one-machine, loopback-only Ray
_PR_SET_CHILD_SUBREAPER = 36  # prctl option (linux/prctl.h)


@dataclass(frozen=True, slots=True)
class RayHandle:
    """The Ray instance serve is running on."""

    owned: bool
    """serve started it (embedded) and must shut it down."""
    local: bool
    """Everything runs on this machine (bind to 127.0.0.1)."""
    node_ip: str
    """The driver's node IP: where the router binds in a cluster."""
    num_gpus: float
    """GPUs in the whole cluster (decides device=auto)."""


def embedded_num_cpus(config: ServeConfig) -> int:
    """Logical CPUs for an embedded instance: the bundles of the most replicas it may run at once (scaling,
    a rolling restart's extra one) + the router (may exceed cores)."""
    from kvmesh.cluster.launch.placement import replica_bundles

    if config.ray.num_cpus is not None:
        return config.ray.num_cpus
    if config.deployments.models:  # several models: every deployment's replicas
        rc = config.replicas
        need = sum(d.num_replicas * sum(b["CPU"] for b in replica_bundles(d.tensor_parallel_size,
                                                                          rc.num_cpus_per_worker, "cpu"))
                   for d in config.deployments.models)
        return int(-(-need // 1)) + DRIVER_CPUS + _placed_router_cpus(config)
    bundles = replica_bundles(config.engine.tensor_parallel_size, config.replicas.num_cpus_per_worker, "cpu")
    per_replica = sum(b["CPU"] for b in bundles)
    return int(-(-config.max_replica_slots * per_replica // 1)) + DRIVER_CPUS + _placed_router_cpus(config)


def _placed_router_cpus(config: ServeConfig) -> int:
    """CPUs the routers placed on the one node of an embedded instance reserve (routers.num_routers -1: one)."""
    routers = config.routers
    return int(-(-max(routers.num_routers, 1 if routers.placed else 0) * routers.router_cpus // 1))


def connect(config: ServeConfig, log_to_driver: bool = False) -> RayHandle:
    """Start or join Ray as the config says (the caller's signal handlers kept); return what serve needs to know
    about it."""
    import ray
    from kvmesh.cluster.interrupts import kept_from_ray

    with kept_from_ray():
        if ray.is_initialized():
            owned = False
        elif config.ray.address is None:
            _start_embedded(config, log_to_driver)
            owned = True
        else:
            ray.init(address=config.ray.address, namespace=config.ray.namespace,
                     log_to_driver=log_to_driver, configure_logging=False)
            owned = False
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_ip = ray.util.get_node_ip_address()
    local = owned or all(n["NodeManagerAddress"] in (node_ip, LOCAL_HOST) for n in nodes)
    num_gpus = float(ray.cluster_resources().get("GPU", 0))
    return RayHandle(owned=owned, local=local and len(nodes) <= 1, node_ip=node_ip, num_gpus=num_gpus)


def secret_env_names() -> tuple[str, ...]:
    """Environment variables that may hold a kvmesh secret (hash seed, API key, admin and internal keys)."""
    from kvmesh.cluster.config.trees import SERVE_SCHEMA

    return tuple(sorted({env for opt in SERVE_SCHEMA.options if opt.secret for env in opt.envs}
                        | {"KVMESH_ADMIN_KEY", "KVMESH_INTERNAL_KEY"}))


@contextlib.contextmanager
def loopback_only():
    """Make the Ray processes started meanwhile listen on 127.0.0.1 only.

    ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough: Ray swaps a loopback node address for
    the machine's reachable IP, and its GCS, raylet, workers and agents then listen on that IP or on
    every interface. Ray keeps loopback only where clusters are off (its macOS/Windows default), which
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` selects: in the environment for Ray's own processes, and in
    the constant this process already read it into."""
    from ray._private import ray_constants

    before_env, before_flag = os.environ.get(_RAY_CLUSTERS_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_RAY_CLUSTERS_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_flag
        if before_env is None:
            os.environ.pop(_RAY_CLUSTERS_ENV, None)
        else:
            os.environ[_RAY_CLUSTERS_ENV] = before_env


@contextlib.contextmanager
def without_secrets_in_env():
    """Hide the secrets' variables from the processes started meanwhile (Ray's GCS, raylet and, through
    it, every worker inherit this process's environment); serve already read them into its config and
    hands them to the actors that need them as arguments."""
    hidden = {name: os.environ.pop(name) for name in secret_env_names() if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


@contextlib.contextmanager
def in_own_session():
    """Start Ray's processes meanwhile (GCS, raylet, and through the raylet every worker) in a session of
    their own.

    ``timeout``, a shell's ``kill -- -PGID`` and job control signal serve's whole process group. Ray's
    processes, left in it, would get the SIGTERM too and die under serve, whose driver then waits 60 s for
    the GCS and is ended by Ray ("Failed to connect to GCS within 60 seconds") instead of stopping.
    Apart, only serve gets the signal and stops them in order (``ray.shutdown``). They still end with serve
    should it be killed: Ray ties them to it (kernel fate-sharing), and serve is their subreaper
    (``adopt_orphans``). Ray starts its processes through one class, which is wrapped here."""
    from ray._private import services

    popen = getattr(services, "ConsolePopen", None)
    if popen is None:  # another Ray: its processes stay in serve's group (a group signal then costs time)
        logger.debug("ray._private.services.ConsolePopen not found; Ray's processes share serve's process group")
        yield
        return

    class OwnSession(popen):
        def __init__(self, *args, **kwargs) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _start_embedded(config: ServeConfig, log_to_driver: bool, attempts: int = 3) -> None:
    """``ray.init`` a local instance (without the secrets in its environment); up to ``attempts`` times, because
    Ray gives its raylet a fixed 30 s to register and a busy machine (a laptop compiling, a loaded CI box) can
    miss that more than once."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            with without_secrets_in_env(), loopback_only(), in_own_session():
                ray.init(
                    address="local",  # embedded: never a RAY_ADDRESS or `ray start` cluster (--address joins one)
                    num_cpus=embedded_num_cpus(config),
                    namespace=config.ray.namespace,
                    include_dashboard=False,
                    log_to_driver=log_to_driver,
                    configure_logging=False,
                    _node_ip_address=LOCAL_HOST,
                )
            return
        except Exception as e:
            if attempt == attempts or "timed out during startup" not in str(e):
                raise
            logger.warning("Ray was slow to start (%s); trying again (attempt %d of %d)", e, attempt + 1, attempts)
            ray.shutdown()
            _kill_own_ray_processes()  # what the failed attempt started (ray.shutdown never knew them)


def _kill_own_ray_processes() -> None:
    """SIGKILL this process's Ray children (GCS, raylet, ...) and all their descendants."""
    import psutil

    doomed: list[psutil.Process] = []
    for child in psutil.Process().children():
        try:
            if any("ray" in part for part in child.cmdline()):
                doomed += [child, *child.children(recursive=True)]
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    for proc in reversed(doomed):  # descendants first
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(doomed, timeout=5)


def adopt_orphans() -> None:
    """Make this process the subreaper of everything it starts (Linux ``PR_SET_CHILD_SUBREAPER``).

    A Ray process whose parent dies first -- the dashboard and runtime-env agents when the raylet goes
    down during start-up -- is then re-parented to this process instead of to init, so
    ``end_descendants`` still finds it. Elsewhere a no-op."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def end_descendants(grace_s: float = 3.0) -> int:
    """SIGTERM every process below this one, SIGKILL those still there after ``grace_s`` (some Ray agents
    ignore SIGTERM); repeated while killing re-parents more of them here. Returns how many were ended."""
    import psutil

    ended = 0
    for _ in range(5):
        doomed = psutil.Process().children(recursive=True)
        if not doomed:
            break
        for proc in doomed:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(doomed, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        ended += len(doomed)
    return ended


GCS_PROBE_TIMEOUT_S = 1.0
"""How long serve's shutdown waits for Ray's GCS to answer before it takes it for gone (``gcs_gone``)."""


def gcs_gone() -> bool:
    """Ray's GCS does not answer: a signal to every process serve started reached it too (systemd's default
    ``KillMode=control-group``; it stops serving at once, its process lingers), and a Ray call that needs it
    (removing a placement group) would wait 60 s for it, until Ray ends serve. One read with a short timeout."""
    import ray

    client = getattr(getattr(ray._private.worker, "global_worker", None), "gcs_client", None)
    if client is None:
        return False
    try:
        client.internal_kv_get(b"kvmesh-gcs-probe", None, timeout=GCS_PROBE_TIMEOUT_S)
    except Exception:  # Ray's RpcError: timed out waiting for the GCS
        return True
    return False


def resolve_device(config: ServeConfig, handle: RayHandle) -> str:
    """device None (auto) -> "cuda" when the cluster has GPUs (the driver's node may have none), else "cpu";
    ValueError when GPUs are shared out on a cluster without any (gpu_share.check_device_share)."""
    from kvmesh.cluster.config.gpu_share import check_device_share

    if config.engine.device is not None:
        return config.engine.device
    device = "cuda" if handle.num_gpus >= 1 else "cpu"
    check_device_share(config.replicas.gpus_per_replica, device, "the Ray cluster has no GPU")
    return device


def router_host(config: ServeConfig, handle: RayHandle) -> str:
    """router.host "auto": 127.0.0.1 on one machine, the node's IP in a cluster; never 0.0.0.0 unless configured."""
    if config.router.host != "auto":
        return config.router.host
    return LOCAL_HOST if handle.local else handle.node_ip


def disconnect(handle: RayHandle | None) -> None:
    import ray

    if handle is not None and handle.owned and ray.is_initialized():
        ray.shutdown()
