"""Speculative decoding: drafts (n-gram prompt lookup or a draft model) verified in one target forward."""
