"""`w4 bench`: what int4 buys on this GPU, for these layers, measured so it can be believed.

One job per module:
    shapes.py   linear-layer shapes from a model's config.json, and KxN parsing (pure, CPU)
    nbytes.py   the bytes each method is credited with, per call (pure; the GB/s definition)
    results.py  the recorded numbers (dataclasses) and the per-token projection (pure)
    runner.py   the GPU measurements, through w4cli/timing.py (the only module that needs CUDA)
    render.py   Rich tables, markdown and JSON from recorded numbers (pure)
"""
