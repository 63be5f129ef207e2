"""gRPC calls over a hand-made HTTP/2 connection (h2), for what the gRPC
client libraries will not do: send a header they refuse, or read nothing
while the server writes."""

import socket
import struct
import time

import h2.config
import h2.connection
import h2.errors
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


def raw_grpc_call(port, method, request, headers=(), cancel_after_s=None, window=None,
                  validate_headers=True, pause_s=None):
    """One call over a hand-made HTTP/2 connection, with `headers` the
    Python client would refuse to send (a `grpc-timeout` it cannot express;
    with `validate_headers` False, a newline or an ESC byte): the response
    headers and trailers, and the response messages' bytes ("data"). With
    `cancel_after_s`, the client resets the stream (CANCEL) that long after
    sending the request. With `window`, the client offers a flow-control
    window of that many bytes and never reads more: a client that stops
    reading; with `pause_s` too, it takes each piece of data that long to
    read and then offers the window again: a client that reads slowly."""
    config = h2.config.H2Configuration(client_side=True,
                                       validate_outbound_headers=validate_headers,
                                       normalize_outbound_headers=validate_headers)
    connection = h2.connection.H2Connection(config)
    result = {"data": b""}
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        connection.initiate_connection()
        if window is not None:
            connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        open_raw_grpc_call(connection, 1, method, request, headers)
        s.sendall(connection.data_to_send())
        ended = False
        cancel_at = None if cancel_after_s is None else time.monotonic() + cancel_after_s
        while not ended:
            if cancel_at is not None and time.monotonic() >= cancel_at:
                connection.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
                s.sendall(connection.data_to_send())
                break
            if cancel_at is not None:
                s.settimeout(max(0.001, cancel_at - time.monotonic()))
            try:
                data = s.recv(65536)
            except socket.timeout:
                if cancel_at is None:
                    raise
                continue
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    result.update((k.decode(), v.decode()) for k, v in event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    if window is not None and pause_s is not None:
                        time.sleep(pause_s)
                    if window is None or pause_s is not None:
                        connection.acknowledge_received_data(event.flow_controlled_length, 1)
                    result["data"] += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            s.sendall(connection.data_to_send())
    return result


def stalled_streams(port, requests, wait_s, method="GenerateStream"):
    """`method` calls (GenerateStream, or Generate) over one hand-made HTTP/2
    connection whose client offers a flow-control window of 0 and never
    reads: not one byte of a message can reach it, though it answers pings.
    Returns, per call, the response headers and trailers and the seconds
    until the call ended (None: still open after `wait_s`)."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    results = {}
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        connection.initiate_connection()
        connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        for i, request in enumerate(requests):
            stream_id = 1 + 2 * i
            results[stream_id] = {"ended_s": None}
            open_raw_grpc_call(connection, stream_id, method, request)
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
