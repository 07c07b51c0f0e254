"""`kthrottle` command line: run the proxy, check a config file, tune quotas, export a capture topic,
describe and alter client quotas of a running proxy."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from proxy.config import ConfigError, ProxyConfig, load_config

log = logging.getLogger("kthrottle")


def _install_uvloop() -> str:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def _raise_open_files_limit() -> int:
    """Every client connection costs two descriptors (it and its upstream): raise the soft limit
    to the hard one, as brokers are run with a high nofile. Returns the limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


async def serve(cfg: ProxyConfig, ready_file: Path | None = None, config_path: Path | None = None) -> None:
    """Run until SIGTERM/SIGINT, then drain and return."""
    from proxy.admin.http import start_admin
    from proxy.reload import watch
    from proxy.server import ProxyServer

    server = ProxyServer(cfg)
    await server.start()
    watcher = asyncio.get_running_loop().create_task(watch(server, config_path)) if config_path else None
    runner = None
    admin_port = None
    if cfg.admin.enabled:
        runner, admin_port = await start_admin(server)
        log.info("admin HTTP on %s:%d", cfg.admin.host, admin_port)
        server.admin_port = admin_port
        if server.cluster_quotas is not None:  # where the other replicas ask whether it is alive
            server.cluster_quotas.admin_port = admin_port
    if ready_file is not None:
        info = {"listeners": {n: lst.port for n, lst in server.listeners.items()}, "admin_port": admin_port}
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    log.info("shutting down: draining for up to %.1fs", cfg.drain_seconds)
    await server.stop()
    if runner is not None:
        await runner.cleanup()
    log.info("stopped")


def check_config(path: Path, cfg: ProxyConfig) -> int:
    """`kthrottle check-config`: the config is valid; print what it enforces (exit 0)."""
    import yaml

    quotas = cfg.quotas.model_dump(mode="json", by_alias=True, exclude_none=True)
    for entities in (quotas["users"], quotas["clients"]):
        for entity in entities.values():
            if entity.get("clients") == {}:
                del entity["clients"]
    tls = "TLS" + (f" (client certificates {cfg.tls.client_auth})" if cfg.tls.client_auth != "none" else "")
    print(
        f"{path}: ok ({cfg.mode} mode, clients over {tls if cfg.tls.enabled else 'plaintext'}, "
        f"brokers over {'TLS' if cfg.upstream_tls.enabled else 'plaintext'})"
    )
    print("# effective quotas from the file (quotas altered through the Kafka Admin API come on top)")
    print(yaml.safe_dump({"quotas": quotas}, sort_keys=False), end="")
    return 0


def capture_export(args: argparse.Namespace) -> int:
    """`kthrottle capture-export`: exit 0 when done, 2 when refused (nothing written then)."""
    from proxy.config import PARQUET_MISSING, capture_bootstrap, parquet_available

    if not parquet_available():
        print(
            f"kthrottle: capture-export: {PARQUET_MISSING.replace('use sink: kafka', 'run it elsewhere')}",
            file=sys.stderr,
        )
        return 2
    from proxy.capture.export import ExportError, export
    from proxy.capture.kafka_sink import security

    logging.basicConfig(
        level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # the client's retries; failures are ours to say
    bootstrap: list[str] = []
    topic = args.topic
    secure: dict[str, object] = {}
    try:
        if args.config is not None:
            cfg = load_config(args.config)
            bootstrap = capture_bootstrap(cfg)
            topic = topic or cfg.capture.kafka.topic
            secure = security(cfg)
    except (ConfigError, OSError) as exc:
        print(f"kthrottle: {exc}", file=sys.stderr)
        return 2
    if args.bootstrap_servers:
        bootstrap = [s.strip() for s in args.bootstrap_servers.split(",") if s.strip()]
    if not bootstrap:
        print("kthrottle: capture-export needs --bootstrap-servers (or --config)", file=sys.stderr)
        return 2
    topic = topic or "__kthrottle_capture"
    if args.max_records is not None and args.max_records < 1:
        print("kthrottle: --max-records must be at least 1", file=sys.stderr)
        return 2
    try:
        result = export(
            bootstrap,
            topic,
            args.output,
            from_beginning=args.from_beginning,
            max_records=args.max_records,
            idle_timeout_s=args.idle_timeout_s,
            to_end=args.to_end,
            skip_invalid=args.skip_invalid,
            security=secure,
        )
    except ExportError as exc:
        print(f"kthrottle: capture-export: {exc}; nothing written", file=sys.stderr)
        return 2
    print(
        f"capture-export: {result.records} records ({result.skipped} skipped) from topic {topic} "
        f"({result.partitions} partitions) into {len(result.files)} files in {args.output}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kthrottle", description="Kafka-protocol throttling proxy")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the proxy")
    run.add_argument("--config", required=True, type=Path, help="YAML config file")
    run.add_argument("--ready-file", type=Path, help="write bound ports as JSON here once listening")
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("config", type=Path)
    sub.add_parser(
        "tune",
        help="propose quotas from capture files (the analytics job on a local Spark; see --help)",
        add_help=False,
    )
    export = sub.add_parser(
        "capture-export",
        help="write the Kafka capture sink's topic out as capture files (what `tune --input` reads)",
    )
    export.add_argument(
        "--bootstrap-servers", help="host:port[,host:port...] of the brokers (default: from --config)"
    )
    export.add_argument("--topic", help="capture topic (default: from --config, else __kthrottle_capture)")
    export.add_argument("--output", required=True, type=Path, help="directory for the Parquet capture files")
    export.add_argument(
        "--config", type=Path, help="a proxy config: its capture.kafka brokers, topic and upstream login"
    )
    export.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest message (else at the end)"
    )
    export.add_argument("--max-records", type=int, help="stop after this many records")
    export.add_argument(
        "--idle-timeout-s", type=float, default=10.0, help="stop after this long without a message (10)"
    )
    export.add_argument(
        "--to-end", action="store_true", help="stop once every partition reached its end as of the start"
    )
    export.add_argument(
        "--skip-invalid",
        action="store_true",
        help="count and skip messages of another schema version or not capture records (default: fail)",
    )
    from proxy.admin import quota_cli, top_cli

    quota_cli.add_parser(sub)
    top_cli.add_parser(sub)
    args, rest = parser.parse_known_args(argv)
    if args.command in ("quotas", "top"):
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return quota_cli.run(args) if args.command == "quotas" else top_cli.run(args)
    if args.command == "capture-export":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return capture_export(args)
    if args.command == "tune":
        # The same job as `spark-submit analytics/tune.py`, on a local Spark unless --master says.
        from analytics.tune import main as tune

        return int(tune(rest))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"kthrottle: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        return check_config(args.config, cfg)
    logging.basicConfig(
        level=cfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from proxy import secrets
    from proxy.ratelog import RateLimitFilter

    # The state exchanges' client (aiokafka) logs every retry of a broker it cannot reach; the
    # exchanges say themselves, once, when they lose and regain the cluster.
    quiet = RateLimitFilter("aiokafka")
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
    secrets.install()  # the upstream password and admin token never reach the log
    if cfg.upstream_sasl is not None and cfg.upstream_sasl.password is not None:
        secrets.register(cfg.upstream_sasl.password)
    loop_kind = _install_uvloop()
    open_files = _raise_open_files_limit()
    log.info(
        "kthrottle starting (%s mode, %s, up to %d open files: about %d client connections)",
        cfg.mode,
        loop_kind,
        open_files,
        open_files // 2,
    )
    from proxy.net.tls import TlsConfigError

    try:
        asyncio.run(serve(cfg, args.ready_file, args.config))
    except TlsConfigError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
