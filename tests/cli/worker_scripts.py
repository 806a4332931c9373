"""The tiny plain-Python worker scripts of the launch tests, and their tools.

No script imports TensorFlow, so that each launch takes a fraction of a
second.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Writes what the worker received to <out>/worker<i>.json.
ENV_SCRIPT = """
import json, os, sys
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
seen = {name: os.environ.get(name) for name in (
    "TF_CONFIG", "KERASTOWER_LOGICAL_DEVICES", "PYTHONUNBUFFERED", "LAUNCH_TEST_MARK")}
seen["argv"] = sys.argv[2:]
seen["modules"] = sorted(m for m in ("tensorflow", "keras") if m in sys.modules)
with open(os.path.join(sys.argv[1], f"worker{i}.json"), "w") as f:
    json.dump(seen, f)
"""

# Worker <failing> exits with <code> once the others are ready; they sleep.
FAIL_SCRIPT = """
import json, os, signal, sys, time
out, failing, code, ignore_term = sys.argv[1:5]
failing, code = int(failing), int(code)
config = json.loads(os.environ["TF_CONFIG"])
i, n = config["task"]["index"], len(config["cluster"]["worker"])
if ignore_term == "yes":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(out, f"ready{i}"), "w").close()
if i == failing:
    while len([p for p in os.listdir(out) if p.startswith("ready")]) < n:
        time.sleep(0.02)
    sys.exit(code)
time.sleep(60)
"""

# Records the signal it gets, after a moment as for a checkpoint, and exits 0.
SIGNAL_SCRIPT = """
import json, os, signal, sys, time
out = sys.argv[1]
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
def stop(signum, frame):
    time.sleep(0.2)
    with open(os.path.join(out, f"signal{i}"), "w") as f:
        f.write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(os.path.join(out, f"ready{i}"), "w").close()
time.sleep(60)
"""


def write_script(tmp_path, text, name="worker.py"):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return str(path), str(out)


def wait_for(paths, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def start_cli(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-X", "importtime", "-m", "kerastower", *args]
    return subprocess.Popen(
        command,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
