"""Training a model: the step, optimisers and schedules, experiment trackers."""

from components import old_module_getattr

# components.training was a module: what it had is found in components.training.step
__getattr__ = old_module_getattr(__name__, "step")
