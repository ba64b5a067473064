"""What a run spec may say, torch-free: the option models of every built-in algorithm, dataset and model, the
participation models, and the spec-time checks. ``fedhop.common.catalog`` names them; validating a spec imports
these modules only, never torch nor an algorithm (the algorithms, datasets and models import their options
from here).
"""
