"""The CRI subset in tests/cri/proto/api.proto speaks the same wire format as the runtime under
test: every service, method, message, field (name, number, type, label) and enum value kept
there is found identical in the runtime.v1 descriptor containerd itself was built with (Go's
generated code embeds it gzipped in the binary)."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

from google.protobuf import descriptor_pb2

from tests.cri.proto import api_pb2
from tests.support import require_tool

GZIP_HEADER = re.compile(rb"\x1f\x8b\x08\x00\x00\x00\x00\x00")
RUNTIME_V1 = b"\n\tapi.proto\x12\nruntime.v1\x1a"  # name "api.proto", package "runtime.v1"


def embedded_runtime_v1(binary: Path) -> descriptor_pb2.FileDescriptorProto:
    data = binary.read_bytes()
    view = memoryview(data)
    for match in GZIP_HEADER.finditer(data):
        try:
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(view[match.start() :], 1 << 20)
        except zlib.error:
            continue
        if raw.startswith(RUNTIME_V1):
            return descriptor_pb2.FileDescriptorProto.FromString(raw)
    raise AssertionError(f"no runtime.v1 descriptor embedded in {binary}")


def ours() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def field_key(f: descriptor_pb2.FieldDescriptorProto) -> tuple[int, int, int, str]:
    # Type names are compared by their last component: ours are `.runtime.v1.X` as theirs.
    return (f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1])


def messages(
    proto: descriptor_pb2.FileDescriptorProto,
) -> dict[str, descriptor_pb2.DescriptorProto]:
    found = {}
    pending = [(m.name, m) for m in proto.message_type]
    while pending:
        name, message = pending.pop()
        found[name] = message
        pending += [(f"{name}.{nested.name}", nested) for nested in message.nested_type]
    return found


def test_subset_matches_containerds_own_descriptor() -> None:
    containerd = Path(require_tool("containerd")).resolve()
    theirs, mine = embedded_runtime_v1(containerd), ours()
    assert mine.package == theirs.package == "runtime.v1"
    their_messages = messages(theirs)
    for name, message in messages(mine).items():
        assert name in their_messages, name
        their_fields = {f.name: field_key(f) for f in their_messages[name].field}
        for f in message.field:
            assert their_fields.get(f.name) == field_key(f), f"{name}.{f.name}"
    their_enums = {e.name: {(v.name, v.number) for v in e.value} for e in theirs.enum_type}
    for enum in mine.enum_type:
        assert {(v.name, v.number) for v in enum.value} <= their_enums[enum.name], enum.name
    their_services = {s.name: {m.name: m for m in s.method} for s in theirs.service}
    for service in mine.service:
        for method in service.method:
            their = their_services[service.name][method.name]
            assert (method.input_type, method.output_type) == (their.input_type, their.output_type)
