"""KServe's ModelServer, reporting the ports it bound (serving.port_file): serving.server's and the
benchmarks' stock KServe server.

ModelServer builds its HTTP (uvicorn) and gRPC servers inside start(), and its gRPC server drops the
port `add_insecure_port` answers, the only way gRPC tells which port it bound. `reporting_bound_ports`
runs a gRPC server that keeps it, and reads the HTTP port off uvicorn's socket once uvicorn has
started (kserve 0.20: ModelServer._rest_server, RESTServer._server; tests/test_serving_server.py
binds port 0 through both).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from kserve import ModelServer
from kserve.model_server import args as kserve_args
from kserve.protocol.grpc.server import GRPCServer

from serving.port_file import Ports

BIND_POLL_SECONDS = 0.01


class PortKeepingGRPCServer(GRPCServer):
    """KServe's gRPC server, keeping the port its start() binds (`bound_port`, None until then)."""

    bound_port: int | None = None

    @property
    def _server(self) -> Any:  # the grpc.aio.Server that KServe's start() makes
        return self._aio_server

    @_server.setter
    def _server(self, server: Any) -> None:
        self._aio_server = server
        if server is not None:
            bind = server.add_insecure_port

            def add_insecure_port(address: str) -> int:
                self.bound_port = bind(address)
                return self.bound_port

            server.add_insecure_port = add_insecure_port


async def _report_once_bound(server: ModelServer, grpc: PortKeepingGRPCServer | None,
                             report: Callable[[Ports], None]) -> None:
    rest = server._rest_server._server  # the uvicorn.Server that ModelServer.start() made
    while not rest.started or (grpc is not None and grpc.bound_port is None):
        await asyncio.sleep(BIND_POLL_SECONDS)
    ports = {"http": rest.servers[0].sockets[0].getsockname()[1]}
    if grpc is not None:
        ports["grpc"] = grpc.bound_port
    report(ports)


def reporting_bound_ports(server: ModelServer, report: Callable[[Ports], None]) -> ModelServer:
    """`server`, which calls `report` with the ports it bound once it listens on all of them. Call
    it once the server's data plane is final: the gRPC server is made here, with that data plane."""
    grpc = None
    if server.enable_grpc:
        # ModelServer.start() makes its gRPC server only when enable_grpc; this one, with the
        # arguments KServe gives its own, takes its place, and stop() stops it (it is _grpc_server).
        grpc = PortKeepingGRPCServer(server.grpc_port, server.dataplane, server.model_repository_extension,
                                     kwargs=vars(kserve_args), grace_period=server.grace_period)
        server.enable_grpc, server._grpc_server = False, grpc
        server.servers.append(grpc.start(server.max_threads))
    server.servers.append(_report_once_bound(server, grpc, report))
    return server
