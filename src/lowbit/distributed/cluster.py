"""Join a Ray cluster, or start a local one and stop it again, with the settings this project's
machines need (issue 26's feasibility study):

- RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: otherwise Ray binds the machine's routable address even
  when told 127.0.0.1; a local cluster here keeps all traffic on 127.0.0.1.
- RAY_USAGE_STATS_ENABLED=0: no usage reports over the network.
- A temporary HOME while the local cluster starts: Ray 2.60 writes an auth token under ~/.ray
  (a second process attaching to it needs RAY_AUTH_MODE=token and that HOME).
- Never `ray stop` (it kills every Ray process on the machine, other people's too): a local
  cluster is stopped by ray.shutdown() from the process that started it, and its temporary
  directory removed; joining an existing cluster only disconnects from it.
"""
from __future__ import annotations

import os
import shutil
import tempfile

RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class RayMissing(ImportError):
    """Ray is not installed (pip install 'lowbit[ray]')."""


def import_ray():
    """The ray module, with this machine's settings in the environment first."""
    for k, v in RAY_ENV.items():
        os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError:
        raise RayMissing("Ray is not installed: pip install 'lowbit[ray]'") from None
    return ray


_LOCAL = {"users": 0, "tmp": None}  # the local cluster this process started, and its users
LOCAL_CPUS = 16  # logical CPUs of a local cluster: scheduling tokens for stages and replicas, not cores


class Cluster:
    """A connection to Ray: `address` joins that cluster ("auto": the one this machine runs);
    None starts a local one on 127.0.0.1 (num_cpus logical CPUs, default LOCAL_CPUS), or shares the
    one this process started already. A connection this process made before is used and left
    alone. close() (or leaving the with block) stops only what was started here, once its last
    user has closed."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        self.ray = ray = import_ray()
        self.local = self.connected = False
        if ray.is_initialized():
            if _LOCAL["users"] > 0:  # ours: share it
                _LOCAL["users"] += 1
                self.local = True
            return
        quiet = dict(include_dashboard=False, log_to_driver=False, logging_level="warning")
        if address:
            ray.init(address=address, **quiet)
            self.connected = True
            return
        # a short path: Ray's unix sockets live under it (108-byte limit)
        tmp = tempfile.mkdtemp(prefix="lowbit-ray-")
        home = os.environ.get("HOME")
        os.environ["HOME"] = tmp  # Ray's auth token goes here, not in the user's home
        try:
            ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=num_cpus or LOCAL_CPUS,
                     _temp_dir=os.path.join(tmp, "r"), **quiet)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            if home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = home
        _LOCAL.update(users=1, tmp=tmp)
        self.local = True

    @property
    def session_dir(self) -> str | None:
        """The local cluster's directory (its processes name it on their command lines)."""
        return _LOCAL["tmp"] if self.local else None

    def close(self) -> None:
        if self.connected:  # joined a cluster: disconnect, it runs on
            self.connected = False
            self.ray.shutdown()
        if self.local:
            self.local = False
            _LOCAL["users"] -= 1
            if _LOCAL["users"] == 0:
                self.ray.shutdown()
                shutil.rmtree(_LOCAL["tmp"], ignore_errors=True)
                _LOCAL["tmp"] = None

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
