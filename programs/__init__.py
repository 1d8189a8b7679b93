"""Shipped configurations: fabric presets (``fabrics/``) and model presets (``models/``).

This is a package only so that the YAML files install with wse-emu; it holds no code.
"""
