"""CRI v1 messages and stubs generated from api.proto (see generate.py): importing this package
brings them up to date first, so `from tests.cri.proto import api_pb2` always works."""

from tests.cri.proto.generate import ensure

ensure()
