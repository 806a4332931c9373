"""Benchmarks of `kerastower.TowerModel` against stock Keras.

Run ``python -m bench`` from the repository root; see ``bench/README.md``.
"""
