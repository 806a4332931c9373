"""Four logical CPUs for every test, configured before TensorFlow starts."""

import kerastower

# At import time of the conftest, before any test builds a model or a tensor:
# once TensorFlow's runtime has started, the device list cannot change.
kerastower.configure_logical_devices(4)
