"""kvmesh.cluster"""
