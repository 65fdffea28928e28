"""cloudtrain: fast training recipes and your own training code on cheap cloud GPUs."""

__version__ = "0.1.0"
