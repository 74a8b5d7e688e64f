"""Control: the running router (runtime.py: replicas added, drained and removed from the set router/replicas/
holds), its probes and event intake, the admin plane, worker processes, and the assembled router."""
