"""A worker that starts its TensorFlow server and waits: the network tests probe it.

``python listening.py OUT`` joins the cluster of its `TF_CONFIG` (through
`kerastower.worker_strategy`, which starts this worker's server), writes its
server's port to ``OUT/port{index}`` and waits until ``OUT/go`` exists
(at most 120 s), then exits with 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

import kerastower


def main(out: str) -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    kerastower.worker_strategy()
    port = config["cluster"]["worker"][index].rsplit(":", 1)[1]
    with open(os.path.join(out, f"port{index}.tmp"), "w") as f:
        f.write(port)
    os.replace(os.path.join(out, f"port{index}.tmp"), os.path.join(out, f"port{index}"))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "go")):
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
