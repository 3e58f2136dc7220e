"""The conflist patcher's JSON output against Go's own encoding/json (a Go program built here:
needs the go compiler)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicall.core.installer import conflist
from multicall.core.installer.conflist import Json, render_go_json
from tests.support import require_tool
from tests.support.documents import json_text, json_values


@pytest.fixture(scope="module")
def go_oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Go program: json.Unmarshal into map[string]any, then MarshalIndent."""
    go = require_tool("go")
    work = tmp_path_factory.mktemp("gojson")
    (work / "go.mod").write_text("module oracle\n\ngo 1.19\n")
    (work / "main.go").write_text(
        'package main\nimport ("encoding/json";"io";"os")\n'
        "func main(){b,_:=io.ReadAll(os.Stdin);var v map[string]any\n"
        "if err:=json.Unmarshal(b,&v);err!=nil{os.Exit(3)}\n"
        'o,_:=json.MarshalIndent(v,"","  ");os.Stdout.Write(o)}\n'
    )
    env = {**os.environ, "GOCACHE": str(work / "cache"), "GOPATH": str(work / "gopath")}
    env["GOFLAGS"] = "-mod=mod"
    env["GOTOOLCHAIN"] = "local"
    subprocess.run([go, "build", "-o", "oracle", "."], cwd=work, env=env, check=True)
    assert shutil.which(str(work / "oracle"))
    return work / "oracle"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=st.dictionaries(json_text, json_values, max_size=5))
def test_render_matches_go_encoding_json(go_oracle: Path, doc: dict[str, Json]) -> None:
    """render_go_json(parse(x)) equals Go's MarshalIndent(Unmarshal(x)) on arbitrary objects."""
    data = json.dumps(doc).encode()
    go = subprocess.run([str(go_oracle)], input=data, capture_output=True, check=True).stdout
    assert render_go_json(conflist.parse_document(data)) == go
