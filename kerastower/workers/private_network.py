"""A private network for local workers: loopback only, unreachable from outside.

TensorFlow's distributed runtime binds every worker's server to ``0.0.0.0``,
every network interface of the machine, whatever address `TF_CONFIG` names
(its gRPC server hard-codes the address), and serves anyone who connects,
without authentication: it runs the graphs it is sent. On Linux,
``kerastower launch -n N`` therefore runs its workers in a network namespace
of their own that holds only a loopback interface. The workers reach each
other on ``127.0.0.1`` as before; nothing outside the namespace reaches
their servers, and they reach no other machine either.

A holder process makes the namespace (``unshare(2)``; inside a user
namespace that maps the caller's own user and group to themselves, unless
the caller is root) and brings its loopback interface up; each worker joins
it (``setns(2)``) between ``fork`` and ``exec``. The namespace lives as long
as the holder, which ends with the launcher. Plain Python, no TensorFlow.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_READY = "ready"

# Run by the holder, a new single-threaded Python (unshare(2) refuses to
# move a threaded process into a new user namespace). It keeps the
# capabilities it gets in its new namespaces as long as it does not exec,
# so it sets its identity maps and brings the loopback interface up itself.
_HOLDER = f"""
import ctypes, fcntl, os, socket, struct, sys
user = os.geteuid() != 0
ids = {{"uid_map": os.geteuid(), "gid_map": os.getegid()}}
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare({_CLONE_NEWNET} | ({_CLONE_NEWUSER} if user else 0)):
    print("unshare:", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
try:
    if user:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        for name, value in ids.items():
            with open(f"/proc/self/{{name}}", "w") as f:
                f.write(f"{{value}} {{value}} 1")
    flags = 0x1 | 0x8 | 0x40  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
    request = struct.pack("16sh22x", b"lo", flags)  # struct ifreq
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, 0x8914, request)  # SIOCSIFFLAGS
except OSError as error:
    print("loopback:", error.strerror or error, flush=True)
    sys.exit(1)
print({_READY!r}, flush=True)
sys.stdin.read()
"""


class PrivateNetwork:
    """A network namespace with loopback only, which local workers join.

    Use `PrivateNetwork.open` to make one, `join` in a new worker before it
    executes its program, and `close` when the workers have exited.
    """

    def __init__(self, holder: subprocess.Popen, user_namespace: bool):
        self.holder = holder
        self.user_namespace = user_namespace

    @classmethod
    def open(cls) -> PrivateNetwork:
        """Makes the namespace.

        Raises:
            OSError: If the system cannot make one: not Linux, or namespaces
                unavailable to this user (a container's seccomp profile, a
                kernel setting such as Ubuntu's
                ``kernel.apparmor_restrict_unprivileged_userns``); the message
                says which call failed and why.
        """
        if not sys.platform.startswith("linux"):
            raise OSError(f"network namespaces need Linux, not {sys.platform}")
        holder = subprocess.Popen(
            [sys.executable, "-I", "-c", _HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = holder.stdout.readline().strip()
        if line != _READY:
            holder.stdin.close()
            holder.wait()
            raise OSError(
                line or f"the namespace holder exited with {holder.returncode}"
            )
        return cls(holder, user_namespace=os.geteuid() != 0)

    def join(self) -> None:
        """Moves the calling process into the namespace.

        Only between ``fork`` and ``exec`` (a `subprocess.Popen`
        ``preexec_fn``): a process with threads cannot change its user
        namespace.
        """
        libc = ctypes.CDLL(None, use_errno=True)
        kinds = [("user", _CLONE_NEWUSER)] if self.user_namespace else []
        for kind, flag in [*kinds, ("net", _CLONE_NEWNET)]:
            fd = os.open(f"/proc/{self.holder.pid}/ns/{kind}", os.O_RDONLY)
            try:
                if libc.setns(fd, flag):
                    raise OSError(ctypes.get_errno(), f"setns({kind}) failed")
            finally:
                os.close(fd)

    def close(self) -> None:
        """Ends the holder; the namespace goes when its last worker has exited."""
        if self.holder.poll() is None:
            self.holder.stdin.close()
            self.holder.wait()
