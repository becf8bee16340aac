"""The in-flight gauge the predictor scales on (dist_ml_requests_in_flight): one up while an inference
request is held, HTTP (the server's middleware) or gRPC (the data plane), and back down when it is
answered or fails, so that an idle server reads 0 and a failed request never leaks a count."""

from __future__ import annotations

import asyncio

import pytest
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import InferRequest
from prometheus_client import REGISTRY

from common.metric_names import IN_FLIGHT_METRIC
from serving.kserve_overrides import StrictDataPlane
from serving.server import LimitAndMeasure

MODEL = "fmnist"


def in_flight() -> float:
    return REGISTRY.get_sample_value(IN_FLIGHT_METRIC)


async def held_while(request: asyncio.Future, release: asyncio.Event) -> list[float]:
    """The gauge before `request`, while it waits for `release`, and after it is done."""
    before = in_flight()
    task = asyncio.ensure_future(request)
    for _ in range(100):  # until the request has reached the held handler
        await asyncio.sleep(0)
    during = in_flight()
    release.set()
    await asyncio.gather(task, return_exceptions=True)
    return [before, during, in_flight()]


def http_call(release: asyncio.Event, fail: bool) -> asyncio.Future:
    async def app(scope, receive, send):
        await release.wait()
        if fail:
            raise RuntimeError("the model failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "path": f"/v1/models/{MODEL}:predict", "headers": [(b"content-length", b"2")]}
    return LimitAndMeasure(app, max_body_bytes=100)(scope, receive, send)


def grpc_call(release: asyncio.Event, fail: bool, monkeypatch: pytest.MonkeyPatch) -> asyncio.Future:
    async def held_infer(self, model_name, request, headers=None):
        await release.wait()
        if fail:
            raise RuntimeError("the model failed")
        return InferRequest(model_name, [], from_grpc=True), {}

    monkeypatch.setattr(DataPlane, "infer", held_infer)  # what StrictDataPlane.infer calls for the model
    plane = StrictDataPlane(model_registry=ModelRepository())
    return plane.infer(MODEL, InferRequest(MODEL, [], from_grpc=True))


@pytest.mark.parametrize("fail", [False, True], ids=["answered", "failed"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_held_request_is_in_flight_until_it_ends(protocol, fail, monkeypatch):
    async def scenario() -> list[float]:
        release = asyncio.Event()
        call = http_call(release, fail) if protocol == "http" else grpc_call(release, fail, monkeypatch)
        return await held_while(call, release)

    before, during, after = asyncio.run(scenario())
    assert (during - before, after - before) == (1, 0)


def test_requests_that_are_not_inference_are_not_counted():
    async def scenario() -> list[float]:
        release = asyncio.Event()

        async def app(scope, receive, send):
            await release.wait()

        scope = {"type": "http", "path": "/metrics", "headers": []}
        return await held_while(LimitAndMeasure(app, max_body_bytes=100)(scope, None, None), release)

    before, during, after = asyncio.run(scenario())
    assert before == during == after
