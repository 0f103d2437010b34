"""apportion: joint resource allocation and execution planning for DL training."""

__version__ = "0.1.0"
