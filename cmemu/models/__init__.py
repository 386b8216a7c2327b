"""Models from their Hugging Face ``config.json`` (``description``) and the step generator that
turns a model and a deployment into a decode or prefill trace (``step``)."""
from cmemu.models.description import ModelDescription, load_model, read_config, shipped_models

__all__ = ["ModelDescription", "load_model", "read_config", "shipped_models"]
