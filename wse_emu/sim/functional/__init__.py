"""The functional engine: a region's stages computing a forward pass through their tiles, greedy
generation on it, and a generated step's timing."""
