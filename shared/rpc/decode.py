"""Decoding a request: exact first, then liberal where the meaning is unambiguous.

The fast path is one typed MessagePack decode. Only a body that fails it takes the
slow path, which accepts what common codecs send for the same meaning
(docs/wire-protocol.md, "Encoding rules"):

* a float with no fractional part where the schema says integer (``5000.0``);
* the MessagePack timestamp extension where a timestamp (RFC 3339 string) is expected,
  and anywhere inside free-form values, where it becomes that string;
* ``nil`` for an optional field, read as "absent".

It refuses what would need a guess: ``bin`` where a string is expected, a float with a
fraction where an integer is, a string where a number is. A JSON body is told that the
endpoint speaks MessagePack. Every refusal names the failing location as ``$.a.b[0]``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import msgspec
import msgspec.inspect as mi

_AT = re.compile(r" - at `(\$[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`$")
REQUEST_MALFORMED = "request-malformed"


class Undecodable(Exception):
    """The body is not a request; ``path`` is where, ``request_id`` what could be read,
    ``code`` the diagnostic (request-malformed unless a missing field has its own)."""

    def __init__(
        self, message: str, path: str | None, request_id: str, code: str = REQUEST_MALFORMED
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.request_id = request_id
        self.code = code


def _ext_hook(code: int, data: memoryview) -> Any:
    # Only the timestamp extension (-1) is handled by msgspec itself; any other is not
    # a JSON value and has no meaning here.
    raise TypeError(f"MessagePack extension type {code} is not accepted")


_generic = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def _rfc3339(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _split_path(message: str) -> tuple[str, str | None]:
    """The message as it is (a person reads the location there too) and the location."""
    found = _AT.search(message)
    return message, None if found is None else found.group(1)


class LiberalDecoder:
    """Decodes ``payload`` as ``type_``; see the module's docstring for what it accepts."""

    def __init__(self, type_: Any, missing_field_codes: dict[str, str] | None = None) -> None:
        # A top-level field whose absence has a code of its own (core: directive-missing).
        self._missing = dict(missing_field_codes or {})
        self._type = type_
        self._info = mi.type_info(type_)
        self._strict = msgspec.msgpack.Decoder(type_)

    def decode(self, payload: bytes) -> Any:
        try:
            return self._strict.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            pass
        return self._slow(payload)

    def _slow(self, payload: bytes) -> Any:
        if not payload:
            raise Undecodable("the request body is empty", "$", "")
        try:
            obj = _generic.decode(payload)
        except RecursionError:
            raise Undecodable("request does not decode: nested too deeply", "$", "") from None
        except (msgspec.DecodeError, TypeError) as exc:
            if payload[:1] in (b"{", b"["):
                self._json_body(payload)
            message, path = _split_path(str(exc))
            raise Undecodable(f"request does not decode: {message}", path or "$", "") from None
        rid = request_id_of(obj)
        if not isinstance(obj, dict):
            if payload[:1] in (b"{", b"["):
                self._json_body(payload)
            raise Undecodable(
                f"request does not decode: expected a map, got {_kind(obj)}", "$", rid
            )
        try:
            fixed = _normalize(obj, self._info, "$")
            return msgspec.convert(fixed, self._type, strict=True)
        except _Refused as exc:
            raise Undecodable(f"request does not decode: {exc.message}", exc.path, rid) from None
        except (msgspec.ValidationError, RecursionError) as exc:
            message, path = _split_path(str(exc) if not isinstance(exc, RecursionError) else "")
            missing = _MISSING.match(message)
            if missing and path is None and missing.group(1) in self._missing:
                field = missing.group(1)
                raise Undecodable(
                    f"the request carries no `{field}`", f"$.{field}", rid, self._missing[field]
                ) from None
            raise Undecodable(
                f"request does not decode: {message or 'nested too deeply'}", path or "$", rid
            ) from None

    @staticmethod
    def _json_body(payload: bytes) -> None:
        try:
            doc = json.loads(payload)
        except (ValueError, RecursionError):
            return
        raise Undecodable(
            "this endpoint speaks MessagePack; the body is JSON. Encode the same map "
            "with a MessagePack library (docs/wire-protocol.md)",
            "$",
            request_id_of(doc),
        )


def request_id_of(obj: Any) -> str:
    """The ``request/id`` of a decoded body when it carries a usable one, else ``""``."""
    if isinstance(obj, dict):
        rid = obj.get("request/id")
        if isinstance(rid, str):
            return rid[:64]
    return ""


class _Refused(Exception):
    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def _kind(value: Any) -> str:
    return {
        bytes: "bin",
        str: "str",
        int: "int",
        float: "float",
        bool: "bool",
        dict: "map",
        list: "array",
        type(None): "nil",
    }.get(type(value), type(value).__name__)


def _normalize(value: Any, info: mi.Type, path: str) -> Any:
    """``value`` with the liberal readings applied where ``info`` makes them unambiguous."""
    while isinstance(info, mi.Metadata):  # Annotated[..., Meta(...)]
        info = info.type
    if isinstance(info, mi.UnionType):
        return _union(value, info, path)
    if isinstance(info, mi.StructType):
        return _struct(value, info, path)
    if isinstance(info, mi.IntType) and isinstance(value, float):
        if value.is_integer():
            return int(value)
        return value  # the strict pass names it
    if isinstance(info, mi.StrType):
        if isinstance(value, bytes | bytearray):
            raise _Refused("MessagePack bin where a string is expected; send a str (UTF-8)", path)
        if isinstance(value, dt.datetime):
            return _rfc3339(value)
        return value
    if isinstance(info, mi.ListType | mi.FrozenSetType | mi.SetType | mi.VarTupleType):
        if isinstance(value, list):
            return [_normalize(v, info.item_type, f"{path}[{i}]") for i, v in enumerate(value)]
        return value
    if isinstance(info, mi.DictType):
        if isinstance(value, dict):
            return {k: _normalize(v, info.value_type, f"{path}.{k}") for k, v in value.items()}
        return value
    if isinstance(info, mi.AnyType):
        return _free(value, path)
    return value


def _union(value: Any, info: mi.UnionType, path: str) -> Any:
    if value is None:
        return None
    members = [t.type if isinstance(t, mi.Metadata) else t for t in info.types]
    structs = [t for t in members if isinstance(t, mi.StructType)]
    if structs and isinstance(value, dict):
        field = structs[0].tag_field
        if field is not None:
            for s in structs:
                if value.get(field) == s.tag:
                    return _struct(value, s, path)
            return value  # the strict pass names the unknown tag
        if len(structs) == 1:
            return _struct(value, structs[0], path)
    others = [t for t in members if not isinstance(t, mi.NoneType | mi.StructType)]
    if len(others) == 1:
        return _normalize(value, others[0], path)
    return _free(value, path) if any(isinstance(t, mi.AnyType) for t in others) else value


def _struct(value: Any, info: mi.StructType, path: str) -> Any:
    if not isinstance(value, dict):
        return value
    fields = {f.encode_name: f for f in info.fields}
    out: dict[Any, Any] = {}
    for key, item in value.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            out[key] = item if info.tag_field == key else _free(item, f"{path}.{key}")
            continue
        if item is None and not _nullable(field.type) and not field.required:
            continue  # nil for an optional field: absent
        out[key] = _normalize(item, field.type, f"{path}.{key}")
    return out


def _nullable(info: mi.Type) -> bool:
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.NoneType | mi.AnyType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_nullable(t) for t in info.types)
    return False


def _free(value: Any, path: str) -> Any:
    """A free-form (JSON) value: timestamps become RFC 3339 strings; bin is refused."""
    if isinstance(value, dt.datetime):
        return _rfc3339(value)
    if isinstance(value, bytes | bytearray):
        raise _Refused("MessagePack bin inside a JSON value; send a str", path)
    if isinstance(value, dict):
        return {k: _free(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_free(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value
