"""The router's replicas: one record per replica (``replica.py``) and the set of them (``replica_set.py``)."""
