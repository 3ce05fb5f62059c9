"""posttrain's job side: one module per algorithm and the shared runtime."""
