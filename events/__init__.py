"""kvmesh.events"""
