"""`w4 bench`: what int4 buys on this GPU, for these layers, measured so it can be believed.

One job per module:
    shapes.py   linear-layer shapes from a model's config.json, and KxN parsing (pure, CPU)
    cases.py    the methods measured, one object each: inputs, run, check, bytes credited per call;
                also what `w4 gemv --time` and dev/ measure
    results.py  the recorded numbers (dataclasses) and the per-token projection (no GPU)
    runner.py   every method on every shape and batch size, through w4cli/gpu/timing.py (needs CUDA)
    render.py   Rich tables, markdown and JSON from recorded numbers (no GPU)
"""
