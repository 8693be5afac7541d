"""Pure-PyTorch reference speculative generator (the CPU oracle) and its CLI."""
