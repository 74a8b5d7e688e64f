"""The emulated replica: the real engine with its forward pass replaced by waiting out a GPU timing profile."""
