"""Request/response logging off the request path, as KServe's logger does it.

Entries go into a bounded queue that a background thread drains into a sink: a file of JSON lines,
or CloudEvents posted to a URL (the format KServe's logger posts, so the same receivers work).
When the queue is full or the sink fails, entries are dropped and counted; a prediction never
waits for, or fails because of, its log entry. A logger can keep only some protocols' entries: on
the cluster KServe's logger (the agent in front of the HTTP port) logs HTTP requests, and the server
logs gRPC ones (GRPC_ONLY), so that each request is logged once.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path
from typing import Callable, Collection

import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from serving.metrics import LOG_ENTRIES_DROPPED

MAX_QUEUED_ENTRIES = 1000
SINK_TIMEOUT_SECONDS = 2.0
EVENT_SOURCE = "dist-ml/serving"
REQUEST_EVENT = "org.kubeflow.serving.inference.request"
RESPONSE_EVENT = "org.kubeflow.serving.inference.response"
logger = logging.getLogger(__name__)

GRPC_ONLY = frozenset({"grpc"})  # entries' "protocol" values (serving.inputs.request_protocol)

Sink = Callable[[dict], None]


def file_sink(path: Path) -> Sink:
    path.parent.mkdir(parents=True, exist_ok=True)
    file = open(path, "a", buffering=1)  # line-buffered: each entry is on disk once written

    def write(entry: dict) -> None:
        file.write(json.dumps(entry) + "\n")

    return write


def cloudevents_sink(url: str) -> Sink:
    """Posts each entry as two binary-mode CloudEvents, request then response, sharing the id."""
    session = requests.Session()

    def post(entry: dict) -> None:
        for event_type, part in ((REQUEST_EVENT, "request"), (RESPONSE_EVENT, "response")):
            event = CloudEvent({"id": entry["id"], "type": event_type, "source": EVENT_SOURCE,
                                "time": entry["time"], "datacontenttype": "application/json"},
                               {key: value for key, value in entry.items() if key != "response"}
                               if part == "request" else entry["response"])
            headers, body = to_binary(event)
            session.post(url, headers=headers, data=body, timeout=SINK_TIMEOUT_SECONDS).raise_for_status()

    return post


class RequestLogger:
    def __init__(self, sink: Sink, max_queued: int = MAX_QUEUED_ENTRIES,
                 protocols: Collection[str] | None = None):
        """`protocols`: log only entries whose "protocol" is one of these (default: all)."""
        self.sink, self.protocols = sink, protocols
        self._queue: queue.Queue[dict] = queue.Queue(max_queued)
        threading.Thread(target=self._drain, name="request-logger", daemon=True).start()

    def log(self, entry: dict) -> None:
        if self.protocols is not None and entry.get("protocol") not in self.protocols:
            return
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            LOG_ENTRIES_DROPPED.inc()

    def _drain(self) -> None:
        while True:
            entry = self._queue.get()
            try:
                self.sink(entry)
            except Exception as error:  # a slow or dead sink costs log entries, nothing else
                LOG_ENTRIES_DROPPED.inc()
                logger.warning("request log entry %s dropped: %s", entry.get("id"), error)
