"""The gRPC API tests' fixtures: one default server (and a Generation stub
on a channel to it) for each test module that asks for them."""

import pytest

import generation_pb2_grpc as pb_grpc
from grpc_harness import Server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def stub(server):
    with server.channel() as channel:
        yield pb_grpc.GenerationStub(channel)
