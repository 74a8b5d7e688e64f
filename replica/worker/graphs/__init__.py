"""kvmesh.replica.worker.graphs: steps on static shapes (CUDA graphs): the decode and short-prefill graphs, their
inputs, and the dispatcher that picks a step's path (a graph or eager)."""
