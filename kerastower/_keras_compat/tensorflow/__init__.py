"""TensorFlow-private step machinery, for either Keras family.

`collectives` starts TensorFlow's collective ops for several workers,
`tower_calls` calls one traced tower function on every device,
`grappler_once` optimises its body once for all of them, `xla`
compiles each tower with XLA instead of the whole step.
"""
