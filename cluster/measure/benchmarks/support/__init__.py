"""What the benchmark areas (and the tests) share, none of it a ``kvmesh bench`` area: the fake replica
(fake_replica.py, its answers, faults, prefix cache, P/D side; fake_thread.py serves it in-process), the HTTP
drivers (json_http.py, router_http.py, peer_load.py, flood_client.py), the hostile publisher (flooder.py), a KV
holder in another process (kv_peer.py), the engines the engine areas drive (engines.py, step_overhead.py)."""
