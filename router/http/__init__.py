"""The HTTP data plane: one door for every request (door.py), the proxy to the replicas (proxy.py), the replica client
(upstream.py)."""
