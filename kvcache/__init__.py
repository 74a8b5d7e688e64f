"""kvmesh.kvcache"""
