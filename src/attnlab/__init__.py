"""attnlab: efficient attention for PyTorch (SwitchHead, SEA) and the measurements that judge it."""

__version__ = "0.1.0"
