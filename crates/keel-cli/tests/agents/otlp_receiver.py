"""A local OTLP/HTTP collector for the tests: decodes what the kernel exports with the
official `opentelemetry-proto` messages and writes it out as JSON lines.

Usage: otlp_receiver.py DIR. Listens on 127.0.0.1 (a free port, written to DIR/port
once listening); each span of every `POST /v1/traces` becomes a line of DIR/spans.jsonl,
each data point of every `POST /v1/metrics` a line of DIR/metrics.jsonl, and the
headers of each request a line of DIR/requests.jsonl. With DIR/drop present it answers
200 and keeps nothing (the benchmark's collector). Anything not protobuf is a 415.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def append(name, rows):
    with open(os.path.join(OUT, name), "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        dropping = os.path.exists(os.path.join(OUT, "drop"))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            reply = ExportTraceServiceResponse()
            if not dropping:
                append("spans.jsonl", spans(request))
        elif self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            reply = ExportMetricsServiceResponse()
            if not dropping:
                append("metrics.jsonl", points(request))
        else:
            self.send_response(404)
            self.end_headers()
            return
        if not dropping:
            append("requests.jsonl", [{"path": self.path, "headers": dict(self.headers.items())}])
        data = reply.SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def spans(request):
    for rs in request.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "attributes": attrs(s.attributes),
                    "status": {"code": s.status.code, "message": s.status.message},
                    "links": [{"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()} for l in s.links],
                    "scope": ss.scope.name,
                    "resource": resource,
                }


def points(request):
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                for p in getattr(m, kind).data_points:
                    row = {"name": m.name, "unit": m.unit, "kind": kind, "attributes": attrs(p.attributes)}
                    if kind == "histogram":
                        row.update(count=p.count, sum=p.sum)
                    yield row


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(os.path.join(OUT, "port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(OUT, "port.tmp"), os.path.join(OUT, "port"))
server.serve_forever()
