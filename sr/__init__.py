"""sr: a Trio router serving small encoder models as pools of worker processes."""

__version__ = "0.1.0"
