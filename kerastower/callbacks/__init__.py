"""Keras callbacks for tower training."""

__all__: list[str] = []
