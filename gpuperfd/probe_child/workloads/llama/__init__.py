"""The llm probe's Llama family (seed 004): ``probe`` (the variants, the roofline, the room check),
``static`` (the static-cache forward in CUDA graphs), ``fused`` (the batch-1 decode step as Triton
kernels) and ``kernels`` (those kernels)."""
