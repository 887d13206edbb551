"""The GPU side: the JIT loader of kernels/, the contract of each kernel, the checks before a launch, timing."""
