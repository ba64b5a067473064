"""The committed stubs of proto/fedhop/v1/fedhop.proto are what protoc makes of it (proto/generate.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto" / "fedhop" / "v1"


def load_generator():
    spec = importlib.util.spec_from_file_location("fedhop_proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def test_committed_stubs_are_up_to_date():
    diffs = gen.check()
    assert not diffs, "stubs are stale; run `python proto/generate.py`:\n" + "".join(diffs)


def copy_tree(tmp_path: Path) -> Path:
    """A copy of proto/ (the .proto and the committed stubs) to edit."""
    root = tmp_path / "proto"
    shutil.copytree(PROTO_DIR, root / "fedhop" / "v1", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_check_detects_an_edited_schema(tmp_path):
    root = copy_tree(tmp_path)
    proto = root / "fedhop" / "v1" / "fedhop.proto"
    text = proto.read_text()
    assert "message Chunk {" in text
    proto.write_text(text.replace("message Chunk {", "message Chunk {\n  uint32 crc = 3;", 1))
    diffs = gen.check(root)
    assert diffs and any("fedhop_pb2.py" in d for d in diffs)
    assert any("crc" in d for d in diffs if "fedhop_pb2.pyi" in d)


def test_check_detects_an_edited_or_missing_stub(tmp_path):
    root = copy_tree(tmp_path)
    grpc_stub = root / "fedhop" / "v1" / "fedhop_pb2_grpc.py"
    grpc_stub.write_text(grpc_stub.read_text().replace("HandOff", "Handoff"))
    assert [d for d in gen.check(root) if "fedhop_pb2_grpc.py" in d]
    (root / "fedhop" / "v1" / "fedhop_pb2.pyi").unlink()
    assert any("fedhop_pb2.pyi" in d for d in gen.check(root))


def test_only_generator_versions_are_ignored():
    stub = (PROTO_DIR / "fedhop_pb2.py").read_text()
    bumped = stub.replace("# Protobuf Python Version: ", "# Protobuf Python Version: 99.", 1)
    assert bumped != stub and gen.normalized(bumped) == gen.normalized(stub)
    grpc_stub = (PROTO_DIR / "fedhop_pb2_grpc.py").read_text()
    bumped = grpc_stub.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '9", 1)
    assert bumped != grpc_stub and gen.normalized(bumped) == gen.normalized(grpc_stub)
    assert gen.normalized(stub.replace("Chunk", "Chunks")) != gen.normalized(stub)


def test_stubs_import_as_fedhop_v1_and_describe_the_services():
    from fedhop.v1 import fedhop_pb2, fedhop_pb2_grpc

    services = fedhop_pb2.DESCRIPTOR.services_by_name
    session = services["Parent"].methods_by_name["Session"]
    assert session.input_type.full_name == session.output_type.full_name == "fedhop.v1.Frame"
    handoff = services["Edge"].methods_by_name["HandOff"]
    assert (handoff.input_type.name, handoff.output_type.name) == ("Frame", "Ack")
    assert services["Edge"].methods_by_name["Describe"].output_type.name == "DescribeReply"
    assert hasattr(fedhop_pb2_grpc, "ParentStub") and hasattr(fedhop_pb2_grpc, "add_EdgeServicer_to_server")
    body = [f.name for f in fedhop_pb2.Frame.DESCRIPTOR.oneofs_by_name["body"].fields]
    assert {"hello", "welcome", "task", "result", "header", "chunk", "error", "bye"} <= set(body)
    # frames.py's raw chunk path hard-codes these field numbers and types
    frame_fields = fedhop_pb2.Frame.DESCRIPTOR.fields_by_name
    chunk_fields = fedhop_pb2.Chunk.DESCRIPTOR.fields_by_name
    assert (frame_fields["call_id"].number, frame_fields["chunk"].number) == (1, 7)
    assert (chunk_fields["offset"].number, chunk_fields["data"].number) == (1, 2)


@pytest.mark.parametrize("name", ["fedhop_pb2.py", "fedhop_pb2_grpc.py", "fedhop_pb2.pyi"])
def test_stub_is_committed_beside_the_proto(name):
    assert (PROTO_DIR / name).is_file()
