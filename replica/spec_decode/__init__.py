"""Speculative decoding: n-gram drafts verified in one target forward."""
