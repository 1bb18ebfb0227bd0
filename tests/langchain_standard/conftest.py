"""This lane's own pytest configuration is its pytest.ini; the shared fixtures it uses come
from the main suite's conftest, which pytest does not load above this lane's ini."""

from tests.conftest import clock, redis_client  # noqa: F401
