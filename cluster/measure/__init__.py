"""kvmesh.cluster.measure: the measuring tools."""
