"""hetero core."""
