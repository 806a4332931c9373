"""`kerastower launch`'s network: local workers reachable from nowhere else.

TensorFlow's servers listen on every interface of the machine, whatever
`TF_CONFIG` says. A local launch runs its workers in a private network
(`kerastower.workers.private_network`): a connection to the machine's own address
reaches their servers with ``--network host`` and is refused without it.
"""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kerastower.workers import launch, private_network

WORKER = Path(__file__).resolve().parents[1] / "workers" / "listening.py"


def _machine_address() -> str | None:
    """An address of this machine other than loopback, or ``None``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for UDP
            address = s.getsockname()[0]
        except OSError:
            address = None
    if address and not address.startswith("127."):
        return address
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


def _reaches(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except OSError:
        return False
    return True


def _private_network_allowed() -> bool:
    try:
        private_network.PrivateNetwork.open().close()
    except OSError:
        return False
    return True


PRIVATE_NETWORK = _private_network_allowed()
needs_address = pytest.mark.skipif(
    _machine_address() is None, reason="this machine has no non-loopback address"
)


def _probe_launch(tmp_path, network: str) -> tuple[list[bool], str]:
    """Launches 2 listening workers; whether the machine's address reaches each."""
    address = _machine_address()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kerastower",
            "launch",
            "-n",
            "2",
            "--towers",
            "1",
            "--network",
            network,
            str(WORKER),
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ports = [tmp_path / f"port{i}" for i in range(2)]
        deadline = time.monotonic() + 120
        while not all(p.exists() for p in ports) and proc.poll() is None:
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        reached = [_reaches(address, int(p.read_text())) for p in ports]
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    return reached, err


@needs_address
@pytest.mark.skipif(not PRIVATE_NETWORK, reason="this system has no network namespaces")
def test_a_local_launch_is_not_reachable_on_the_machines_address(tmp_path):
    reached, err = _probe_launch(tmp_path, "private")
    assert reached == [False, False]
    assert "the workers run in a private network" in err


@needs_address
def test_with_the_host_network_the_servers_are_reachable_and_the_launcher_says_so(
    tmp_path,
):
    # The probe's control: the same servers on this machine's network answer
    # on its address, as TensorFlow binds them to every interface.
    reached, err = _probe_launch(tmp_path, "host")
    assert reached == [True, True]
    assert "accept connections on every network interface" in err


def _refuse(*args, **kwargs):
    raise OSError("unshare: Operation not permitted")


def test_without_namespaces_the_launcher_says_the_servers_are_exposed(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(private_network.PrivateNetwork, "open", _refuse)
    script = tmp_path / "worker.py"
    script.write_text("print('trained')\n")
    assert launch.launch([str(script)], 1) == 0
    err = capsys.readouterr().err
    assert "could not get a private network (unshare: Operation not permitted)" in err
    assert "accept connections on every network interface" in err


def test_asking_for_a_private_network_where_there_is_none_is_an_error(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(private_network.PrivateNetwork, "open", _refuse)
    script = tmp_path / "worker.py"
    script.write_text("raise SystemExit('must not run')\n")
    with pytest.raises(OSError, match="network='host'"):
        launch.launch([str(script)], 1, network="private")


@pytest.mark.skipif(not PRIVATE_NETWORK, reason="this system has no network namespaces")
def test_a_worker_in_the_private_network_sees_loopback_only(tmp_path):
    network = private_network.PrivateNetwork.open()
    try:
        seen = subprocess.run(
            [sys.executable, "-c", "print(open('/proc/net/dev').read())"],
            preexec_fn=network.join,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        network.close()
    interfaces = [line.split(":")[0].strip() for line in seen.splitlines()[2:] if line]
    assert interfaces == ["lo"]


def test_a_bad_network_is_refused():
    with pytest.raises(ValueError, match="`network` must be one of"):
        launch.launch(["train.py"], 1, network="public")
