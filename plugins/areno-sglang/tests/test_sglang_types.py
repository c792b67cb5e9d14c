"""Every request areno sends to SGLang, and every answer of the protocol server, checked with
the types of the sglang release named in ``areno_sglang.compat`` (its wheel, installed without
its CUDA dependencies by ``scripts/dev.sh`` into ``.cache/sglang-VERSION``).

What is checked against what:

* ``/generate`` bodies: SGLang's HTTP contract gate, ``sglang.api.v1.api_types.GenerateRequest``
  (its ``SamplingParams`` refuses unknown keys), as the server runs it before serving;
* the control routes (weight updates, weight-update groups, memory release and resume, pause
  and continue): the request structs of ``sglang/srt/managers/io_struct.py``, validated the
  way SGLang's FastAPI routes validate a JSON body (pydantic, with SGLang's own schema
  adapter), and with no key the struct does not declare (SGLang would ignore it silently);
* the protocol server's answers: ``GenerateResponse``, ``GetModelInfoResponse``,
  ``GetServerInfoResponse`` of the API types, and the weight routes' ``*ReqOutput`` structs.

``io_struct.py`` imports half of SGLang's runtime (CUDA kernels among it), so the structs are
taken from its source: the class definitions the test needs are compiled beside a two-field
``BaseReq`` (its only base) and SGLang's own ``msgspec_utils`` module. Nothing here imports
``sglang`` by name, so the rest of the suite still runs as on a machine without it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from areno_sglang.client import SGLangClient
from areno_sglang.compat import SGLANG_TESTED
from areno_sglang.protocol_server import SAMPLING_KEYS
from areno_sglang.weights import GroupSync, disk_payload, pickle_serializer, tensor_payload

from areno_core.contracts.engine import RolloutSession
from areno_core.engine_conformance import conformance_model, conformance_prompts
from areno_core.types import SamplingParams

ROOT = Path(__file__).resolve().parents[3]
SOURCE = Path(os.environ.get("ARENO_SGLANG_SOURCE", ROOT / ".cache" / f"sglang-{SGLANG_TESTED}"))
REQUESTS = {
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/release_memory_occupation": "ReleaseMemoryOccupationReqInput",
    "/resume_memory_occupation": "ResumeMemoryOccupationReqInput",
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
}
ANSWERS = {
    "/update_weights_from_disk": "UpdateWeightFromDiskReqOutput",
    "/update_weights_from_tensor": "UpdateWeightsFromTensorReqOutput",
}


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # msgspec resolves annotations through the module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sglang() -> types.SimpleNamespace:
    package = SOURCE / "sglang"
    if not package.is_dir():
        message = (
            f"sglang {SGLANG_TESTED} is not installed at {SOURCE} (bash scripts/dev.sh setup "
            "installs it there)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must check the payloads, never skip them
        pytest.skip(message)
    pytest.importorskip("msgspec", reason="SGLang's API types are msgspec structs")
    api = _load(package / "api" / "v1" / "api_types.py", "_areno_sglang_api_types")
    utils = _load(package / "srt" / "utils" / "msgspec_utils.py", "_areno_sglang_msgspec_utils")
    return types.SimpleNamespace(api=api, io=_io_structs(package, utils))


def _io_structs(package: Path, utils: types.ModuleType) -> types.ModuleType:
    """The request/response structs areno uses, compiled from ``io_struct.py``'s source."""
    source = (package / "srt" / "managers" / "io_struct.py").read_text()
    wanted = {*REQUESTS.values(), *ANSWERS.values()}
    classes = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name in wanted
    ]
    assert {c.name for c in classes} == wanted, "io_struct.py no longer defines these"
    for node in classes:
        assert [ast.unparse(b) for b in node.bases] == ["BaseReq"], node.name
    module = types.ModuleType("_areno_sglang_io_structs")
    sys.modules[module.__name__] = module
    prelude = (
        "from __future__ import annotations\n"
        "from typing import Annotated, Any, Dict, List, Literal, Optional, Union\n"
        "import msgspec\n"
        "class BaseReq(msgspec.Struct, tag=True, kw_only=True):\n"
        "    rid: Optional[str] = None\n"
        "    http_worker_ipc: Optional[str] = None\n"
        "    @classmethod\n"
        "    def __get_pydantic_core_schema__(cls, source, handler):\n"
        "        return _schema(cls, handler)\n"
    )
    module.__dict__.update(
        _schema=utils.msgspec_struct_pydantic_core_schema, Base64Bytes=utils.Base64Bytes
    )
    exec(compile(prelude, "io_struct-prelude", "exec"), module.__dict__)
    body = "\n\n".join(ast.get_source_segment(source, c) or "" for c in classes)
    exec(
        compile("from __future__ import annotations\n" + body, "io_struct.py", "exec"),
        module.__dict__,
    )
    return module


def _check_request(sglang: types.SimpleNamespace, route: str, payload: Any) -> None:
    import msgspec
    from pydantic import TypeAdapter

    if route == "/generate":
        sglang.api.GenerateRequest.from_json_value(payload)  # SGLang's contract gate
        return
    cls = getattr(sglang.io, REQUESTS[route])
    declared = {f.name for f in msgspec.structs.fields(cls)}
    extra = sorted(set(payload) - declared)
    assert not extra, f"{route}: SGLang's {cls.__name__} has no {extra} (it would ignore them)"
    TypeAdapter(cls).validate_json(json.dumps(payload))  # what its FastAPI route does


@pytest.fixture
def traffic(monkeypatch) -> list[tuple[str, str, Any, int, Any]]:
    """Every request areno's client sends in the test: (method, route, payload, status,
    answer)."""
    seen: list[tuple[str, str, Any, int, Any]] = []
    original = SGLangClient.request

    def record(self, method, route, payload=None, *, timeout_s=None):
        status, body = original(self, method, route, payload, timeout_s=timeout_s)
        seen.append((method, route, payload, status, body))
        return status, body

    monkeypatch.setattr(SGLangClient, "request", record)
    return seen


def test_sampling_keys_of_the_protocol_server_are_sglangs(sglang):
    import msgspec

    fields = {f.name for f in msgspec.structs.fields(sglang.api.SamplingParams)}
    assert fields == SAMPLING_KEYS


def test_every_request_and_answer_of_a_remote_and_a_colocated_run_is_valid(
    sglang, traffic, protocol_server, sglang_engine, colocated_engine
):
    policy = conformance_model(0)
    prompts = conformance_prompts()
    samplings = [
        SamplingParams(max_new_tokens=6, greedy=True),
        SamplingParams(max_new_tokens=6, temperature=0.7, top_k=5, top_p=0.9, seed=3),
        SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(7,), seed=4),
    ]
    remote = sglang_engine(policy, [protocol_server()], sglang_weight_sync="disk")
    colocated = colocated_engine(policy, protocol_server())
    for engine in (remote, colocated):
        for version in (0, 1):
            engine.sync_weights(policy, version=version)
            with RolloutSession(engine, drop_state=True):
                for sampling in samplings:
                    engine.generate(prompts[:3], sampling, n=2)
    routes = {route for _, route, *_ in traffic}
    assert {
        "/generate",
        "/update_weights_from_disk",
        "/pause_generation",
        "/continue_generation",
        "/flush_cache",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/model_info",
        "/server_info",
    } <= routes
    for method, route, payload, status, answer in traffic:
        assert status == 200, (route, answer)
        if method == "POST" and route != "/flush_cache":
            _check_request(sglang, route, payload)
        if route == "/generate":
            for item in answer if isinstance(answer, list) else [answer]:
                sglang.api.GenerateResponse.from_json_value(item)
        elif route == "/model_info":
            sglang.api.GetModelInfoResponse.from_json_value(answer)
        elif route == "/server_info":
            sglang.api.GetServerInfoResponse.from_json_value(answer)
        elif route in ANSWERS:
            _check_request_answer(sglang, route, answer)


def _check_request_answer(sglang: types.SimpleNamespace, route: str, answer: Any) -> None:
    import msgspec
    from pydantic import TypeAdapter

    cls = getattr(sglang.io, ANSWERS[route])
    declared = {f.name for f in msgspec.structs.fields(cls)}
    assert set(answer) <= declared, (route, sorted(set(answer) - declared))
    TypeAdapter(cls).validate_python(answer)


def test_tensor_update_and_weight_group_bodies_are_valid(sglang, protocol_server):
    model = conformance_model(0)
    pairs = [(n, t.detach()) for n, t in model.state_dict().items()][:3]
    blob = pickle_serializer(pairs)
    for last in (False, True):
        _check_request(
            sglang, "/update_weights_from_tensor", tensor_payload(blob, 2, last=last, version=4)
        )
    group = GroupSync(
        [SGLangClient("http://127.0.0.1:1")],
        tp_sizes=[2],
        address="127.0.0.1",
        port=29500,
        backend="nccl",
        group_name="areno-weights-0",
        timeout_s=10.0,
    )
    _check_request(
        sglang, "/init_weights_update_group", group.join_payload(1, 1 + sum(group.tp_sizes))
    )
    for last in (False, True):
        _check_request(
            sglang,
            "/update_weights_from_distributed",
            group.update_payload(pairs, last=last, version=7),
        )
    _check_request(sglang, "/destroy_weights_update_group", {"group_name": group.group_name})
    _check_request(sglang, "/update_weights_from_disk", disk_payload(Path("/tmp/w"), 2))
    with pytest.raises(AssertionError, match="no \\['weight_versoin'\\]"):  # the check bites
        _check_request(
            sglang, "/update_weights_from_disk", {"model_path": "x", "weight_versoin": "1"}
        )
    with pytest.raises(Exception, match="temprature"):
        _check_request(
            sglang, "/generate", {"input_ids": [1], "sampling_params": {"temprature": 1}}
        )
    assert torch.is_tensor(pairs[0][1])


def test_docs_name_the_sglang_release_the_payloads_are_checked_against():
    text = (ROOT / "docs" / "rollout.md").read_text()
    assert f"release {SGLANG_TESTED}" in text
    assert f"SGLang {SGLANG_TESTED}" in (ROOT / "plugins/areno-sglang/README.md").read_text()


def test_admin_routes_are_those_sglang_guards_with_the_admin_key(sglang):
    import re

    from areno_sglang.client import ADMIN_ROUTES

    source = (SOURCE / "sglang" / "srt" / "entrypoints" / "http_server.py").read_text()
    decorated = re.findall(
        r'@app\.(?:get|post|api_route)\(\s*"([^"]+)"[^\n]*\n@auth_level\(AuthLevel\.(\w+)\)',
        source,
    )
    levels = dict(decorated)
    assert {route: levels.get(route) for route in ADMIN_ROUTES} == dict.fromkeys(
        ADMIN_ROUTES, "ADMIN_OPTIONAL"
    )
    for route in ("/generate", "/model_info", "/server_info", "/health"):
        assert levels.get(route) is None  # the API key (or none) opens them
