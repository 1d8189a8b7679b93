"""Figures and reports from programs and results (heatmaps, timelines, curves).

It imports ``wse_emu`` result types only; nothing here is needed to compile or simulate.
"""
