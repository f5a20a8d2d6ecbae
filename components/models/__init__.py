"""Encoders: the small-image ConvNet and torchvision backbones (`encoders.py`)."""

from components import old_module_getattr

# components.models was a module: what it had is found in components.models.encoders
__getattr__ = old_module_getattr(__name__, "encoders")
