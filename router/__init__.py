"""kvmesh.router"""
