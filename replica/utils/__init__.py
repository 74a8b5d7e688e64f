"""kvmesh.replica.utils: small device helpers every room of the engine core may use (below attention/, sample/,
worker/)."""
