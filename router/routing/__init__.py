"""Routing: the prefix index, router keys, policies, predictions and the load view (pure, no I/O, no HTTP)."""
