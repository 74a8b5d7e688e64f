"""kvmesh.replica.sample: sampling and logprobs."""
