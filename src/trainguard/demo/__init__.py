"""A small training script bundled with trainguard: the Quick start's demo and the overhead benchmark's workload."""
