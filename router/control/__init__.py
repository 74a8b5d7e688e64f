"""Control: the replica set, its probes and event intake, the admin plane, worker processes, and the assembled router."""
