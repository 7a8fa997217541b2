"""omnilearn: heterogeneity emulation and dynamic batching for distributed PyTorch training."""

__version__ = "0.1.0"
