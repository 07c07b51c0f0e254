"""The traffic capture record: one per request the proxy saw, the facts its quotas decided on.

Defined once here, as plain names and type names, and read by both sides: the proxy builds its
Parquet (Arrow) schema from it and the analytics job its Spark schema, so the two cannot drift.
Files carry ``CAPTURE_SCHEMA_VERSION`` in their metadata under ``CAPTURE_VERSION_KEY``; a
reader refuses files of another version rather than guessing.

Never payloads, keys or headers: sizes, counts, ids and decisions only.

Types: ``int16``, ``int32``, ``int64``, ``float64``, ``bool``, ``string``, ``list<int16>``,
``list<int64>``, and ``list<partition>`` (a list of ``PARTITION_FIELDS`` structs).
"""

from __future__ import annotations

from typing import Final, NamedTuple

CAPTURE_SCHEMA_VERSION: Final = 1
CAPTURE_VERSION_KEY: Final = "kthrottle.capture.version"
CAPTURE_FILE_SUFFIX: Final = ".parquet"


class Field(NamedTuple):
    name: str
    type: str
    doc: str


PARTITION_FIELDS: Final[tuple[Field, ...]] = (
    Field("topic", "string", "topic name (or the topic id in hex where the request had no name)"),
    Field("partition", "int32", "partition index"),
    Field("bytes", "int64", "record-set bytes: produced (Produce) or returned (Fetch)"),
    Field("records", "int32", "records in the set, from batch headers (-1 when not known)"),
)

FIELDS: Final[tuple[Field, ...]] = (
    Field("ts_ms", "int64", "epoch milliseconds when the proxy read the request"),
    Field("proxy", "string", "proxy instance that saw it"),
    Field("node", "int32", "broker node id the connection fronts (-1: bootstrap or sidecar port)"),
    Field("conn", "int64", "connection id, unique within a proxy run"),
    Field("client_addr", "string", "client address (ip:port)"),
    Field("principal", "string", "authenticated user (ANONYMOUS without SASL)"),
    Field("client_id", "string", "client id from the request header"),
    Field("api_key", "int16", "Kafka API key"),
    Field("api_version", "int16", "API version"),
    Field("request_bytes", "int64", "request size, header + body (what a produce quota charges)"),
    Field("response_bytes", "int64", "the broker's response size (what a fetch quota charges); 0: none"),
    Field("partitions", "list<partition>", "topic-partition bytes of a Produce request or Fetch response"),
    Field("producer_ids", "list<int64>", "distinct producer ids in the Produce request's batches"),
    Field("new_producer_ids", "int32", "of those, ids new to the user's window (-1: not tracked)"),
    Field("mutations", "int32", "partition mutations the request asked for (-1: not a mutation request)"),
    Field("mutations_rejected", "int32", "of those, mutations in topics the proxy rejected"),
    Field("error_codes", "list<int16>", "distinct non-zero error codes in the response, when it was decoded"),
    Field("throttle_ms", "int32", "throttle the proxy applied (0 in dry-run)"),
    Field("decided_throttle_ms", "int32", "throttle the proxy decided, applied or not"),
    Field("broker_throttle_ms", "int32", "throttle_time_ms the broker reported (-1: not read)"),
    Field("upstream_ms", "float64", "request sent to response received (-1: answered by the proxy)"),
    Field("dry_run", "bool", "whether the throttle was only reported: dry-run mode, or the client exempt"),
)

FIELD_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in FIELDS)


def arrow_schema() -> object:
    """The Parquet/Arrow schema (a ``pyarrow.Schema``) with the version in its metadata.

    pyarrow is imported here, not at module level, so the policy code never needs it.
    """
    import pyarrow as pa

    scalar = {
        "int16": pa.int16(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "string": pa.string(),
    }
    partition = pa.struct([pa.field(f.name, scalar[f.type], nullable=False) for f in PARTITION_FIELDS])
    types = {
        **scalar,
        "list<int16>": pa.list_(pa.int16()),
        "list<int64>": pa.list_(pa.int64()),
        "list<partition>": pa.list_(partition),
    }
    fields = [pa.field(f.name, types[f.type], nullable=False) for f in FIELDS]
    return pa.schema(fields, metadata={CAPTURE_VERSION_KEY: str(CAPTURE_SCHEMA_VERSION)})
