"""Hardware as described by its presets: the wafer fabric (FabricSpec, clusters of wafers) and
accelerator instances by their roofline. Above util and models."""
