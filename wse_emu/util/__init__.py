"""Utilities every layer may use: they import nothing of the project's but its errors."""
