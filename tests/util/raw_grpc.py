"""gRPC calls over a hand-made HTTP/2 connection (h2), for what the gRPC
client libraries will not do: send a header they refuse, or read nothing
while the server writes."""

import socket
import struct
import time

import h2.config
import h2.connection
import h2.events
import h2.settings


def open_raw_grpc_call(connection, stream_id, method, request, extra_headers=()):
    """Sends a gRPC call's headers and its one request message, ending the
    client's side, on a hand-made HTTP/2 connection (h2)."""
    body = request.SerializeToString()
    connection.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"),
                                        (":path", "/switchserve.v1.Generation/" + method),
                                        (":authority", "127.0.0.1"), ("te", "trailers"),
                                        ("content-type", "application/grpc"),
                                        *extra_headers])
    connection.send_data(stream_id, b"\0" + struct.pack(">I", len(body)) + body,
                         end_stream=True)


def stalled_streams(port, requests, wait_s):
    """GenerateStream calls over one hand-made HTTP/2 connection whose client
    offers a flow-control window of 0 and never reads: not one byte of a
    message can reach it, though it answers pings. Returns, per call, the
    response headers and trailers and the seconds until the call ended (None:
    still open after `wait_s`)."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    results = {}
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        connection.initiate_connection()
        connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        for i, request in enumerate(requests):
            stream_id = 1 + 2 * i
            results[stream_id] = {"ended_s": None}
            open_raw_grpc_call(connection, stream_id, "GenerateStream", request)
        s.sendall(connection.data_to_send())
        start = time.monotonic()
        while (time.monotonic() - start < wait_s
               and any(r["ended_s"] is None for r in results.values())):
            s.settimeout(0.05)
            try:
                data = s.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            for event in connection.receive_data(data):
                result = results.get(getattr(event, "stream_id", None))
                if result is None:
                    continue
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    result.update((k.decode(), v.decode()) for k, v in event.headers)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    if result["ended_s"] is None:
                        result["ended_s"] = time.monotonic() - start
            s.sendall(connection.data_to_send())  # PING and SETTINGS acks only
    return [results[k] for k in sorted(results)]
