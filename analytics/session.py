"""The Spark session and the capture input: which files, whether they are captures we can read.

Input is refused before any work when it is unreadable, empty, of another capture schema version
or of mixed schemas (``InputError``: one line, exit code 2, nothing written). Local paths (a file,
a directory searched recursively for ``*.parquet``, or a glob) are checked file by file from the
Parquet footers with pyarrow, before Spark even starts. Remote URIs (``s3a://``, ``hdfs://``,
``gs://``, ... anything Hadoop reads) are checked through Spark: the schemas of all files are
merged (a type conflict fails the merge), the result must be the capture schema, and the footers'
``kthrottle.capture.version`` is read through Hadoop.

Spark runs on ``local[*]`` unless ``--master`` says otherwise; under ``spark-submit`` the master
given to spark-submit is kept. For local masters ``SPARK_LOCAL_IP`` defaults to 127.0.0.1: on
machines whose hostname does not resolve, Spark would otherwise pick an unreachable address.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from analytics.shipping import ship
from quota.capture_schema import (
    CAPTURE_FILE_SUFFIX,
    CAPTURE_SCHEMA_VERSION,
    CAPTURE_VERSION_KEY,
    FIELDS,
    PARTITION_FIELDS,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

APP_NAME = "kthrottle-tune"
MAX_REMOTE_FOOTERS = 10_000  # version check of remote files: footers read through Hadoop, at most this many


class InputError(Exception):
    """The input cannot be analysed; the message is one line, for the user."""


@dataclass
class CaptureInput:
    """What the job will read: the paths handed to Spark and what the footers said about them."""

    spec: str
    paths: list[str]
    remote: bool
    files: int = 0
    rows: int | None = None  # from the footers (local input only)
    bytes: int | None = None
    notes: list[str] = field(default_factory=list)


# --- the session -----------------------------------------------------------------------------------


def _local_cores(master: str) -> int | None:
    """Cores of a local master (local, local[4], local[*], local[2,3]), None for a cluster."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\*|\d+)(?:,\d+)?\]", master)
    if m is None:
        return None
    return (os.cpu_count() or 2) if m.group(1) == "*" else int(m.group(1))


def _cluster_cores(spark: SparkSession) -> int:
    """Cores the application may use on a cluster, as far as its config says (at least 16).

    Executors register after the session starts, so the scheduler's count is not known yet; the
    config (``spark.cores.max``, or executor instances x cores) is, where it is set."""
    conf = spark.sparkContext.getConf()
    cores = int(conf.get("spark.cores.max", "0") or 0)
    if not cores and conf.contains("spark.executor.instances"):
        cores = int(conf.get("spark.executor.instances", "0")) * int(conf.get("spark.executor.cores", "1"))
    return max(16, cores, spark.sparkContext.defaultParallelism)


def build_session(master: str | None = None, app_name: str = APP_NAME) -> SparkSession:
    """A SparkSession for the job, or the active one (tests, bench and spark-submit bring their own).

    ``master`` None means: spark-submit's master when run under it, else ``local[*]``. Either way
    the job's packages are shipped to the Python workers (analytics.shipping).
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        ship(active.sparkContext)
        return active
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit (or pyspark) started the JVM
    if master is None and not under_submit:
        master = "local[*]"
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if _local_cores(master) is not None:  # before the JVM starts: it reads both at launch
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            if "SPARK_DRIVER_MEMORY" not in os.environ:
                builder = builder.config("spark.driver.memory", "2g")
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
    )
    spark = builder.getOrCreate()
    cores = _local_cores(spark.sparkContext.master or "")  # also spark-submit's --master
    if cores is not None:
        # Aggregates after the first pass are small: a few shuffle partitions per core, not 200.
        spark.conf.set("spark.sql.shuffle.partitions", str(max(4, 2 * cores)))
        # Split input files finely enough to keep every core busy (row groups are the unit).
        spark.conf.set("spark.sql.files.minPartitionNum", str(max(4, 3 * cores)))
        # AQE would merge those small shuffles into one partition: one busy core for all that follows.
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    elif not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # A cluster: Spark's 200 shuffle partitions cost a task each per stage (measured: 50 s of a
        # 65 s job on one core), for aggregates of a few MB after map-side combining. A few per
        # core the job is given, where the config says; adaptive execution merges what is too many.
        spark.conf.set("spark.sql.shuffle.partitions", str(3 * _cluster_cores(spark)))
    spark.sparkContext.setLogLevel("ERROR")
    ship(spark.sparkContext)  # the Python workers import the job's packages from this zip
    return spark


# --- the capture schema, for Spark -----------------------------------------------------------------


def _spark_type(name: str) -> DataType:
    from pyspark.sql import types as T

    scalar: dict[str, DataType] = {
        "int16": T.ShortType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
        "float64": T.DoubleType(),
        "bool": T.BooleanType(),
        "string": T.StringType(),
    }
    if name in scalar:
        return scalar[name]
    if name == "list<int16>":
        return T.ArrayType(T.ShortType(), containsNull=False)
    if name == "list<int64>":
        return T.ArrayType(T.LongType(), containsNull=False)
    if name == "list<partition>":
        part = T.StructType([T.StructField(f.name, scalar[f.type], nullable=False) for f in PARTITION_FIELDS])
        return T.ArrayType(part, containsNull=False)
    raise ValueError(f"capture schema type {name!r} has no Spark type")


def spark_schema() -> StructType:
    """The capture record as a Spark schema (quota/capture_schema.py, version 1)."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(f.name, _spark_type(f.type), nullable=False) for f in FIELDS])


def _arrow_shape(t: Any) -> str:
    """A type's structure with list item names and nullability left out (writers differ on both)."""
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_arrow_shape(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_arrow_shape(f.type)}" for f in t) + ">"
    if pa.types.is_large_string(t):
        return "string"
    return str(t)


def _spark_shape(t: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(t, T.ArrayType):
        return f"array<{_spark_shape(t.elementType)}>"
    if isinstance(t, T.StructType):
        return "struct<" + ",".join(f"{f.name}:{_spark_shape(f.dataType)}" for f in t.fields) + ">"
    return str(t.simpleString())


def _schema_difference(found: list[tuple[str, str]], expected: list[tuple[str, str]]) -> str | None:
    """One line saying how a file's columns differ from the capture schema, or None."""
    got, want = dict(found), dict(expected)
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    changed = [f"{n} is {got[n]}, expected {want[n]}" for n in want if n in got and got[n] != want[n]]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing))
    if extra:
        parts.append("unexpected " + ", ".join(extra))
    parts += changed[:3]
    return "; ".join(parts) or None


# --- which files ---------------------------------------------------------------------------------


def is_remote(spec: str) -> bool:
    """Whether a path is a non-local Hadoop URI (file:// and plain paths are local)."""
    scheme = urlparse(spec).scheme
    return bool(scheme) and scheme != "file" and len(scheme) > 1  # 'C:' is a drive, not a scheme


def _local_path(spec: str) -> str:
    return urlparse(spec).path if spec.startswith("file:") else spec


def _wanted(path: Path) -> bool:
    # As Spark does, names starting with '.' or '_' are not data (the proxy's .inprogress files
    # do not end in .parquet anyway).
    return path.name.endswith(CAPTURE_FILE_SUFFIX) and not path.name.startswith((".", "_"))


def local_files(spec: str) -> list[str]:
    """The capture files a local directory, glob or file names, sorted."""
    path = _local_path(spec)
    if glob.has_magic(path):
        found: set[Path] = set()
        for match in glob.glob(path, recursive=True):
            m = Path(match)
            if m.is_dir():
                found.update(f for f in m.rglob(f"*{CAPTURE_FILE_SUFFIX}") if _wanted(f))
            elif _wanted(m):
                found.add(m)
        files = sorted(found)
    elif os.path.isdir(path):
        files = sorted(f for f in Path(path).rglob(f"*{CAPTURE_FILE_SUFFIX}") if _wanted(f) and f.is_file())
    elif os.path.isfile(path):
        files = [Path(path)]
    else:
        raise InputError(f"input {spec}: no such file or directory")
    if not files:
        raise InputError(f"input {spec}: no capture files (*{CAPTURE_FILE_SUFFIX}) found")
    return [str(f) for f in files]


def check_local(spec: str) -> CaptureInput:
    """Resolve a local input and check every file's footer: readable, version 1, the capture schema."""
    import pyarrow.parquet as pq

    from quota.capture_schema import arrow_schema

    files = local_files(spec)
    expected = [(f.name, _arrow_shape(f.type)) for f in arrow_schema()]  # type: ignore[attr-defined]
    want_version = str(CAPTURE_SCHEMA_VERSION).encode()
    rows = size = 0
    first_schema: list[tuple[str, str]] | None = None
    for f in files:
        try:
            meta = pq.read_metadata(f)
            schema = meta.schema.to_arrow_schema()
        except Exception as exc:  # pyarrow raises several kinds; all mean the same to the user
            raise InputError(f"{f}: unreadable Parquet file ({_one_line(exc)})") from exc
        version = (schema.metadata or {}).get(CAPTURE_VERSION_KEY.encode())
        if version is None:
            raise InputError(f"{f}: not a kthrottle capture file (no {CAPTURE_VERSION_KEY} in its metadata)")
        if version != want_version:
            raise InputError(
                f"{f}: capture schema version {version.decode(errors='replace')}; "
                f"this job reads version {CAPTURE_SCHEMA_VERSION}"
            )
        found = [(fld.name, _arrow_shape(fld.type)) for fld in schema]
        if first_schema is not None and found != first_schema:
            diff = _schema_difference(found, first_schema)
            raise InputError(f"mixed schemas: {f} differs from {files[0]} ({diff or 'column order'})")
        diff = _schema_difference(found, expected)
        if diff is not None or [n for n, _ in found] != [n for n, _ in expected]:
            raise InputError(
                f"{f}: not the capture schema v{CAPTURE_SCHEMA_VERSION} ({diff or 'column order'})"
            )
        first_schema = found
        rows += meta.num_rows
        size += os.path.getsize(f)
    if rows == 0:
        raise InputError(f"input {spec}: {len(files)} capture files but no records")
    return CaptureInput(spec, files, remote=False, files=len(files), rows=rows, bytes=size)


def _one_line(exc: BaseException) -> str:
    """The gist of an error: Spark's ``[ERROR_CLASS] message`` when there is one (Py4J wraps it in
    lines of Java), else the first line."""
    full = str(exc)
    found = re.findall(r"\[([A-Z][A-Z_]+)\] ([^\n]*)", full)
    if found:
        code, message = found[-1]  # the innermost cause says most
        return f"[{code}] {message}"[:300]
    text = full.strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _remote_versions(spark: SparkSession, files: list[str]) -> None:
    """Read ``kthrottle.capture.version`` from remote footers through Hadoop's Parquet reader."""
    context: Any = spark.sparkContext  # py4j handles: untyped
    jvm, conf = context._jvm, context._jsc.hadoopConfiguration()
    parquet = jvm.org.apache.parquet.hadoop
    want = str(CAPTURE_SCHEMA_VERSION)
    for f in files[:MAX_REMOTE_FOOTERS]:
        reader = parquet.ParquetFileReader.open(
            parquet.util.HadoopInputFile.fromPath(jvm.org.apache.hadoop.fs.Path(f), conf)
        )
        try:
            version = reader.getFooter().getFileMetaData().getKeyValueMetaData().get(CAPTURE_VERSION_KEY)
        finally:
            reader.close()
        if version is None:
            raise InputError(f"{f}: not a kthrottle capture file (no {CAPTURE_VERSION_KEY} in its metadata)")
        if str(version) != want:
            raise InputError(f"{f}: capture schema version {version}; this job reads version {want}")


def check_remote(spark: SparkSession, spec: str) -> CaptureInput:
    """Resolve and check a remote input through Spark (schemas merged, then footers' versions)."""
    spark.sparkContext.setLogLevel("OFF")  # a failed merge is our one-line error, not a Java trace
    try:
        merged = (
            spark.read.option("mergeSchema", "true")
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", f"*{CAPTURE_FILE_SUFFIX}")
            .parquet(spec)
        )
        files = sorted(merged.inputFiles())
    except Exception as exc:
        text = _one_line(exc)
        if "MERGE" in str(exc).upper():
            raise InputError(f"input {spec}: mixed schemas ({text})") from exc
        raise InputError(f"input {spec}: unreadable ({text})") from exc
    finally:
        spark.sparkContext.setLogLevel("ERROR")
    if not files:
        raise InputError(f"input {spec}: no capture files (*{CAPTURE_FILE_SUFFIX}) found")
    expected = [(f.name, _spark_shape(f.dataType)) for f in spark_schema().fields]
    found = [(f.name, _spark_shape(f.dataType)) for f in merged.schema.fields]
    diff = _schema_difference(found, expected)
    if diff is not None:
        raise InputError(
            f"input {spec}: mixed schemas or not the capture schema v{CAPTURE_SCHEMA_VERSION} ({diff})"
        )
    notes = []
    try:
        _remote_versions(spark, files)
        if len(files) > MAX_REMOTE_FOOTERS:
            notes.append(f"version checked on the first {MAX_REMOTE_FOOTERS} of {len(files)} files")
    except InputError:
        raise
    except Exception as exc:  # e.g. Spark Connect: no JVM to ask; the schema check stands
        notes.append(f"capture version not checked ({_one_line(exc)})")
    return CaptureInput(spec, files, remote=True, files=len(files), notes=notes)


def read_captures(spark: SparkSession, source: CaptureInput) -> DataFrame:
    """The capture records of a checked input, with the capture schema (no inference pass)."""
    try:
        return spark.read.schema(spark_schema()).parquet(*source.paths)
    except Exception as exc:
        raise InputError(f"input {source.spec}: unreadable ({_one_line(exc)})") from exc
