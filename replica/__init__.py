"""kvmesh.replica"""
