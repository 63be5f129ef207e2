"""The HTTP API tests' fixtures: one default server (and an `openai` client
of it) for each test module that asks for them."""

import pytest

from http_harness import Server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()
