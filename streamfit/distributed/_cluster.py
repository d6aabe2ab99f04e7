"""A Ray cluster on this machine (the CLI's local instance, tests, benchmarks): a head and extra nodes on 127.0.0.1.

Each node is a ``ray start --block`` process in its own process group, with its temporary directory and
``HOME`` under ``root``, every port chosen here (free loopback ports; worker ports from a private range
above the ephemeral one), no dashboard.  :meth:`LocalRayCluster.stop` kills each node's process group by
id (Ray's workers ignore SIGTERM): nothing else on the machine is touched.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["LocalRayCluster", "connect_loopback"]

#: Ray turns a node address of 127.0.0.1 into the machine's outbound interface address (to be reachable from
#: other machines): these processes keep the loopback address they are given, so no Ray traffic leaves it.
_KEEP_LOOPBACK = "import ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host"
_LAUNCH = (f"import sys; {_KEEP_LOOPBACK}; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; "
           "sys.exit(main())")


def connect_loopback(address: str, **options: Any) -> Any:
    """``ray.init`` into the cluster at ``address`` as a driver on 127.0.0.1 (the nodes' address)."""
    import ray
    import ray._private.services as services

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    resolve = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host
    try:
        return ray.init(address=address, _node_ip_address="127.0.0.1", logging_level="ERROR", **options)
    finally:
        services.resolve_ip_for_localhost = resolve

#: worker ports come from [_WORKER_PORTS_LOW, 65535), a block of _WORKER_PORTS per node.
_WORKER_PORTS_LOW = 61000
_WORKER_PORTS = 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports(n: int, taken: set[int], reserved: range = range(0)) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1, none in ``taken`` (they are added to it) or ``reserved``: the
    sockets stay open together while the ports are chosen, so the OS cannot hand one out twice (one-at-a-time
    picks can repeat a port, and a Ray node then refuses to start: "port ... used by other components")."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in taken and port not in reserved:
                ports.append(port)
                taken.add(port)
    finally:
        for s in socks:
            s.close()
    return ports


class LocalRayCluster:
    """``nodes`` Ray nodes (the first is the head) with ``cpus`` CPUs each, on 127.0.0.1; a context manager.

    ``address`` is the head's ``127.0.0.1:PORT`` (for ``ray.init(address=...)``); :meth:`connect` connects
    this process as a driver.  Node processes inherit this process's environment with ``HOME`` set to
    ``root/home`` and ``env`` on top (e.g. ``RAY_health_check_period_ms`` to see a lost node sooner).
    :meth:`kill_node` SIGKILLs one node (a machine lost).
    """

    def __init__(self, root: str | os.PathLike[str], nodes: int = 2, cpus: int = 1,
                 object_store_bytes: int = 100 * 2**20, timeout: float = 90.0,
                 env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.temp_dir = self.root / "ray"
        self.home = self.root / "home"
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "HOME": str(self.home), "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_TMPDIR": str(self.temp_dir), **(env or {})}
        self._worker_base = random.randrange(_WORKER_PORTS_LOW, 65535 - _WORKER_PORTS * nodes, _WORKER_PORTS)
        #: the ports handed out to this cluster's nodes, each once (and none in the workers' range)
        self._ports: set[int] = set()
        self._workers = range(self._worker_base, self._worker_base + _WORKER_PORTS * nodes)
        self.port = _free_ports(1, self._ports, self._workers)[0]
        self.address = f"127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self._cpus, self._store_bytes = cpus, object_store_bytes
        try:
            for i in range(nodes):
                self._start_node(i, cpus, object_store_bytes, self._worker_base + i * _WORKER_PORTS)
            self._wait_for_nodes(nodes, timeout)
        except BaseException:
            self.stop()
            raise

    def _start_node(self, i: int, cpus: int, object_store_bytes: int, worker_base: int) -> None:
        flags = ("--object-manager-port", "--node-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port", "--dashboard-port")
        ports = dict(zip(flags, _free_ports(len(flags), self._ports, self._workers)))
        dashboard = ports.pop("--dashboard-port")
        cmd = [sys.executable, "-c", _LAUNCH, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
               f"--object-store-memory={object_store_bytes}", f"--min-worker-port={worker_base}",
               f"--max-worker-port={worker_base + _WORKER_PORTS - 1}", "--disable-usage-stats",
               *(f"{k}={v}" for k, v in ports.items())]
        if i == 0:
            cmd += ["--head", f"--port={self.port}", "--include-dashboard=false", f"--dashboard-port={dashboard}",
                    f"--temp-dir={self.temp_dir}"]
        else:
            cmd += [f"--address={self.address}"]
        log = open(self.root / f"node-{i}.log", "wb")
        self._logs.append(log)
        self._procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True))
        if i == 0:
            self._wait_for_head(60.0)

    def _wait_for_head(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray head did not listen on {self.address} within {timeout} s")
                time.sleep(0.1)

    def _check_alive(self) -> None:
        for i, p in enumerate(self._procs):
            if p.poll() is not None:
                log = (self.root / f"node-{i}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Ray node {i} exited with {p.returncode}:\n{log}")

    def _wait_for_nodes(self, nodes: int, timeout: float) -> None:
        """Wait until the head reports ``nodes`` live nodes (asked in a short-lived driver process)."""
        code = ("import ray, sys; from streamfit.distributed._cluster import connect_loopback; "
                "connect_loopback(sys.argv[1]); print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            out = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True,
                                 env=self.env, timeout=timeout)
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(nodes)]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray cluster at {self.address}: {nodes} nodes not up within {timeout} s "
                                   f"({out.stdout[-500:]} {out.stderr[-1500:]})")
            time.sleep(0.5)

    @property
    def node_pids(self) -> list[int]:
        """Process ids of the ``ray start`` processes, one per node (each leads its process group)."""
        return [p.pid for p in self._procs]

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``'s process group (its raylet, object store and workers): a machine lost at once."""
        if i == 0:
            raise ValueError("node 0 is the head: killing it ends the cluster")
        proc = self._procs[i]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)

    def connect(self, **options: Any) -> Any:
        """``ray.init`` this process into the cluster (on 127.0.0.1); returns ray's context."""
        return connect_loopback(self.address, **options)

    def stop(self) -> None:
        """Kill every node's process group (the node and the Ray processes it started) and wait for them."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self._procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
