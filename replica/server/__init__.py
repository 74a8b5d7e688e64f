"""kvmesh.replica.server: the replica's HTTP server, the OpenAI layer (openai/) over this replica's engine."""
