"""A proxyfleet provider written in Python: hands out proxies from a fixed
list of endpoints, as the first-party `static` plugin does, keeping who
holds which in the entry's key-value store.

Built into a WebAssembly component with componentize-py against the
provider contract (`wit/world.wit`, `proxyfleet:provider@0.5.0`); see
README.md here. Config: `{"endpoints": ["host:port", ...]}`.

The store holds two keys per assignment: `endpoint/<host:port>` (the
ownership mark as JSON) and `holder/<uid>` (the endpoint). Each is written
with a compare-and-swap, so two creates for one Proxy, or for one endpoint,
never both win.
"""

import json
import time
from typing import List, Optional, Tuple

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import config, kv, log
from wit_world.imports.types import (
    CallContext,
    Capabilities,
    Health,
    Instance,
    InstanceState,
    OwnershipMark,
    PluginInfo,
    ProviderError_Conflict,
    ProviderError_InvalidConfig,
    ProviderError_NotFound,
    ProviderError_QuotaExceeded,
    ProviderError_Transient,
    ProxySpec,
)

CONTRACT_VERSION = "0.5.0"
VERSION = "0.1.0"
SCHEMA = json.dumps(
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["endpoints"],
        "properties": {
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "uniqueItems": True,
                "items": {"type": "string", "description": "host:port"},
            }
        },
    }
)


def _config(text: str) -> List[str]:
    """The endpoints of a config; every error names the key."""
    try:
        config = json.loads(text)
    except ValueError as error:
        raise Err(ProviderError_InvalidConfig(f"the config is not JSON: {error}"))
    if not isinstance(config, dict):
        raise Err(ProviderError_InvalidConfig("the config is not an object"))
    for key in config:
        if key != "endpoints":
            raise Err(
                ProviderError_InvalidConfig(f"unknown key `{key}`; the only key is `endpoints`")
            )
    endpoints = config.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        raise Err(ProviderError_InvalidConfig("`endpoints`: list at least one host:port"))
    for endpoint in endpoints:
        host, _, port = str(endpoint).rpartition(":")
        if not isinstance(endpoint, str) or not host or not port.isdigit() or int(port) > 65535:
            raise Err(ProviderError_InvalidConfig(f"`endpoints`: {endpoint!r} is not host:port"))
    if len(set(endpoints)) != len(endpoints):
        raise Err(ProviderError_InvalidConfig("`endpoints`: an endpoint is listed twice"))
    return endpoints


def _get(key: str) -> Optional[kv.KvEntry]:
    try:
        return kv.get(key)
    except Err as error:
        raise Err(ProviderError_Transient(f"the key-value store failed: {error.value}"))


def _swap(key: str, expected: Optional[int], value: Optional[bytes]) -> bool:
    """Whether the compare-and-swap applied."""
    try:
        outcome = kv.compare_and_swap(key, expected, value)
    except Err as error:
        raise Err(ProviderError_Transient(f"the key-value store failed: {error.value}"))
    return isinstance(outcome, kv.CasOutcome_Applied)


def _instance(endpoint: str, mark: dict) -> Instance:
    host, _, port = endpoint.rpartition(":")
    return Instance(
        provider_id=endpoint,
        name=mark["name"],
        state=InstanceState.RUNNING,
        addresses=[host.strip("[]")],
        port=int(port),
        created_at=mark["created_at"],
        mark=OwnershipMark(
            installation=mark["installation"],
            uid=mark["uid"],
            namespace=mark["namespace"],
            name=mark["name"],
            created_at=mark["created_at"],
        ),
    )


def _held(endpoint: str) -> Optional[Instance]:
    entry = _get(f"endpoint/{endpoint}")
    return None if entry is None else _instance(endpoint, json.loads(entry.value))


class Provider(exports.Provider):
    def describe(self) -> PluginInfo:
        return PluginInfo(
            name="python-static",
            version=VERSION,
            contract_version=CONTRACT_VERSION,
            config_schema=SCHEMA,
            capabilities=Capabilities(http=[]),
        )

    def validate_config(self, text: str) -> List[Tuple[str, str]]:
        _config(text)
        # No lookup table: a create reads the whole list (config.json()).
        return []

    def create(self, ctx: CallContext, spec: ProxySpec) -> Instance:
        endpoints = _config(config.json())
        # The credential, if any, is the endpoint's own: these proxies are
        # not started here, so there is nothing to configure.
        holder = _get(f"holder/{spec.uid}")
        if holder is not None:
            adopted = _held(holder.value.decode())
            if adopted is not None:
                return adopted
        mark = {
            "installation": spec.installation,
            "uid": spec.uid,
            "namespace": spec.namespace,
            "name": spec.name,
            "created_at": int(time.time()),
        }
        for endpoint in endpoints:
            if not _swap(f"endpoint/{endpoint}", None, json.dumps(mark).encode()):
                continue
            if holder is None and not _swap(f"holder/{spec.uid}", None, endpoint.encode()):
                # Another create for this Proxy won meanwhile: give ours back.
                _release(endpoint)
                raise Err(ProviderError_Conflict(f"another create for {spec.uid} is running"))
            if holder is not None:
                _swap(f"holder/{spec.uid}", holder.version, endpoint.encode())
            log.log(log.Level.INFO, "endpoint assigned", [("endpoint", endpoint)])
            return _instance(endpoint, mark)
        raise Err(ProviderError_QuotaExceeded(f"all {len(endpoints)} endpoints are assigned"))

    def get(self, ctx: CallContext, provider_id: str) -> Instance:
        instance = _held(provider_id)
        if instance is None:
            raise Err(ProviderError_NotFound(f"no endpoint {provider_id} is assigned"))
        return instance

    def delete(self, ctx: CallContext, provider_id: str) -> None:
        _release(provider_id)

    def list(self, ctx: CallContext) -> List[Instance]:
        try:
            entries = kv.list("endpoint/")
        except Err as error:
            raise Err(ProviderError_Transient(f"the key-value store failed: {error.value}"))
        return [
            _instance(entry.key[len("endpoint/") :], json.loads(entry.value)) for entry in entries
        ]

    def check(self, ctx: CallContext) -> Health:
        return Health(healthy=True, issues=[])


def _release(endpoint: str) -> None:
    """Frees `endpoint` and its holder; one already free counts as freed."""
    entry = _get(f"endpoint/{endpoint}")
    if entry is None:
        return
    uid = json.loads(entry.value)["uid"]
    holder = _get(f"holder/{uid}")
    if holder is not None and holder.value.decode() == endpoint:
        _swap(f"holder/{uid}", holder.version, None)
    _swap(f"endpoint/{endpoint}", entry.version, None)
    log.log(log.Level.INFO, "endpoint released", [("endpoint", endpoint)])
