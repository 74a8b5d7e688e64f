"""kvmesh.router: the KV-cache-aware router (never imports torch), in five rooms, one way down
(control -> http -> routing -> replicas), admission beside routing.

    config.py   RouterConfig (the router's section of the config tree) and the ``--replica`` spec
    replicas/   one record per replica (replica.py: role, state, health, load, models, stream) and the
                set of them (replica_set.py)
    routing/    the decision, pure: router keys, the prefix index, predictions, the load view, sessions,
                receipts, policies, the cost in seconds, KV placement, model pools, KVRouter
                (tokens -> keys -> match -> policy -> replica)
    admission/  admission's policy, pure and clock-free: tenants, fair share, token buckets, the ledger,
                the queue per model, a replica's room (the simulator runs the same code)
    http/       the data plane: the one door every request enters (door.py), the proxy and the
                ProxyRequest that carries a request to its replica, the admission gate, stream relay and
                migration, the replica connection pool, metrics
    control/    the running router (runtime.py), probes and passive health, the KV event intake, models
                and adapters, the app and admin plane, worker processes, the assembled router
                (router_server.py: RouterServer)

The OpenAI front end itself (request models, auth, body limits, /tokenize) is ``kvmesh.replica.openai``
on the torch-free serving core ``kvmesh.replica.serving``, the parts of replica/ the router imports.
"""
