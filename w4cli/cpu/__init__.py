"""w4's CPU kernels: built on first use from kernels/cpu/, with the pure-torch reference as fallback."""
