"""Pure-PyTorch reference speculative generator (the CPU oracle); ``demo`` drives it by hand."""
