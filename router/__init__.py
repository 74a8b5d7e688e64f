"""kvmesh.router: the KV-cache-aware router (never imports torch), in three rooms, one way down.

    config.py   RouterConfig (the router's section of the config tree) and the ``--replica`` spec
    routing/    the decision, pure: router keys, the prefix index, predictions, the load view, sessions,
                receipts, policies, KVRouter (tokens -> keys -> match -> policy -> replica)
    http/       the data plane: the one door every request enters (door.py), the proxy and the
                ProxyRequest that carries a request to its replica, stream relay and migration, the
                replica connection pool, metrics
    control/    the replica set (runtime.py), probes, the KV event intake, the app and admin plane,
                worker processes, the assembled router (router_server.py: RouterServer)

The OpenAI front end itself (request models, auth, body limits, /tokenize) is ``kvmesh.replica.openai``
on the torch-free serving core ``kvmesh.replica.serving``, the parts of replica/ the router imports.
"""
