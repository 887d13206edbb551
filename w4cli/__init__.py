"""w4: int4 (W4A16, AWQ) checkpoints, correct to the bit and as fast as the GPU allows."""

__version__ = "0.1.0"
