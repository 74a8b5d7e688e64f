"""``kvmesh sim``: replay a trace through the real router index and policies in front of N
simulated replicas, each owning a real ``kvcache`` block pool whose events feed the index.

Model time comes from a cost model (:mod:`.cost_model`); everything else — block hashing,
LRU eviction, KV events, router keys, prefix matching, policy choice — is the production code.
Package import is light: nothing here imports torch.
"""
