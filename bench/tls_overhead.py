"""Throughput through kthrottle with TLS on both sides versus TLS straight to the broker, side by side.

The broker has an SSL listener that requires client certificates. Kafka's own perf tools run
alternately (a) straight to that listener with a client certificate, and (b) through kthrottle,
whose client listener is TLS with client certificates (mTLS) and whose broker link is TLS with
its own certificate: the proxy decrypts, reads and re-encrypts every byte. Prints per-round
figures, then one JSON line:

  tls_producer_throughput_ratio   proxy / direct records/s, ProducerPerformance, 1 KiB records, acks=1
  tls_consumer_throughput_ratio   proxy / direct records/s, ConsumerPerformance over the same topic
  tls_proxy_cpu_s_per_gb          the proxy process's CPU seconds (utime + stime) per GB (1e9 bytes)
                                  of record values through it, {"produce": ..., "consume": ...}:
                                  on two cores shared with the broker and the clients, what the
                                  proxy spends is what they do not get
  tls_relay_producer_throughput_ratio,
  tls_relay_consumer_throughput_ratio
                                  the same for (c), a bare relay on uvloop's TLS both sides
                                  (relay_floor's, a process of its own, with the proxy's
                                  certificates) in front of a second SSL listener of the broker
                                  that advertises the relay's port: what any proxy on this event
                                  loop's TLS gets here, before any of kthrottle's code
  tls_relay_cpu_s_per_gb          the relay's CPU per GB, as tls_proxy_cpu_s_per_gb
  tls_producer_to_relay,          the proxy's records/s over the relay's, round by round
  tls_consumer_to_relay

With ``--baseline DIR`` a second proxy, run from another checkout's source tree, takes its turn
in each round too (a change to the TLS path, measured against the code before it in the same
rounds: the direct figures move by a fifth from run to run here), and these are added:

  tls_producer_to_baseline,       this proxy's records/s over the baseline's, round by round
  tls_consumer_to_baseline
  baseline_cpu_s_per_gb           the baseline proxy's CPU per GB, as tls_proxy_cpu_s_per_gb

Usage: source dev/setup.sh && python bench/tls_overhead.py [--rounds 3] [--records 1000000] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay_floor
from passthrough import cpu_per_gb

from dev.certs import CertificateAuthority
from dev.harness import BrokerTls, KafkaCluster
from dev.perf_tools import consume, produce
from dev.proxy_process import ProxyProcess, gateway_config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000, help="records per throughput run")
    parser.add_argument("--baseline", type=Path, help="another checkout's source tree, run side by side")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kthrottle-tls-bench-"))
    ca = CertificateAuthority(work / "pki")
    broker = ca.issue("broker", "broker", dns=("localhost",), ips=("127.0.0.1",))
    server = ca.issue("proxy", "proxy", dns=("localhost",), ips=("127.0.0.1",))
    upstream = ca.issue("proxy-upstream", "kthrottle-proxy")
    client = ca.issue("client", "bench", org_unit="clients")
    keystores = {}
    for name, files in (("broker", broker), ("client", client)):
        keystores[name] = work / f"{name}-keystore.pem"  # Kafka's PEM store: key, then chain
        keystores[name].write_bytes(files.key.read_bytes() + files.cert.read_bytes())
    client_tls = {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.cert_path),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystores["client"]),
    }
    consumer_config = work / "client-tls.properties"
    consumer_config.write_text("".join(f"{k}={v}\n" for k, v in client_tls.items()))

    tls = BrokerTls(keystore=keystores["broker"], truststore=ca.cert_path, client_auth="required")
    with (
        KafkaCluster(brokers=1, tls=tls, relayed_listeners=("FLOOR_SSL",)) as cluster,
        contextlib.ExitStack() as stack,
    ):

        def proxy_config() -> dict[str, Any]:
            cfg = gateway_config(cluster, log_level="WARNING")
            cfg["gateway"]["upstream_bootstrap"] = cluster.ssl_bootstrap_servers.split(",")
            cfg["tls"] = {
                "enabled": True,
                "certfile": str(server.cert),
                "keyfile": str(server.key),
                "cafile": str(ca.cert_path),
                "client_auth": "required",
            }
            cfg["upstream_tls"] = {
                "enabled": True,
                "cafile": str(ca.cert_path),
                "certfile": str(upstream.cert),
                "keyfile": str(upstream.key),
            }
            return cfg

        proxies = {"proxy": stack.enter_context(ProxyProcess(proxy_config(), workdir=work / "proxy"))}
        if args.baseline:
            source = args.baseline.resolve()
            baseline = ProxyProcess(proxy_config(), workdir=work / "baseline", source=source)
            proxies["baseline"] = stack.enter_context(baseline)
        bound, advertised = cluster.nodes[0].relayed["FLOOR_SSL"]
        relay_tls = {
            "certfile": str(server.cert),
            "keyfile": str(server.key),
            "cafile": str(ca.cert_path),
            "upstream_certfile": str(upstream.cert),
            "upstream_keyfile": str(upstream.key),
        }
        relay = stack.enter_context(relay_floor.RelayServer(advertised, ("127.0.0.1", bound), tls=relay_tls))
        paths = {
            "direct": cluster.ssl_bootstrap_servers,
            **{k: p.bootstrap for k, p in proxies.items()},
            "relay": cluster.nodes[0].relayed_address("FLOOR_SSL"),
        }
        cluster.create_topic("bench", 6)
        for boot in paths.values():  # JIT and page cache, every way
            produce(boot, "bench", 50_000, -1, props=client_tls)
        prod: dict[str, list[float]] = {name: [] for name in paths}
        cons: dict[str, list[float]] = {name: [] for name in paths}
        # each proxy's (and the relay's) CPU seconds per GB, per workload
        pids = {k: p.proc.pid for k, p in proxies.items() if p.proc is not None} | {"relay": relay.pid}
        own: dict[str, dict[str, list[float]]] = {k: {"produce": [], "consume": []} for k in pids}

        def measured(rnd: int, workload: str, name: str, run: Callable[[], dict[str, float]]) -> float:
            pid = pids.get(name)
            result, cpu = cpu_per_gb(pid, args.records, run)
            line = f"round {rnd} TLS {workload} {name}: {result['rate']:.0f} rec/s"
            if pid is not None:
                own[name][workload].append(cpu)
                line += f", {'relay' if name == 'relay' else 'proxy'} CPU {cpu:.2f} s/GB"
            print(line, flush=True)
            return float(result["rate"])

        for rnd in range(args.rounds):
            order = list(paths.items())
            if rnd % 2:
                order.reverse()
            for name, boot in order:
                run = functools.partial(produce, boot, "bench", args.records, -1, props=client_tls)
                prod[name].append(measured(rnd, "produce", name, run))
            for name, boot in order:
                run = functools.partial(consume, boot, "bench", args.records, command_config=consumer_config)
                cons[name].append(measured(rnd, "consume", name, run))

    med = statistics.median
    figures: dict[str, Any] = {
        "tls_producer_throughput_ratio": round(med(prod["proxy"]) / med(prod["direct"]), 3),
        "tls_consumer_throughput_ratio": round(med(cons["proxy"]) / med(cons["direct"]), 3),
        "producer_records_per_s": {k: round(med(v)) for k, v in prod.items()},
        "consumer_records_per_s": {k: round(med(v)) for k, v in cons.items()},
        "tls_proxy_cpu_s_per_gb": {w: round(med(v), 2) for w, v in own["proxy"].items()},
        "tls_relay_producer_throughput_ratio": round(med(prod["relay"]) / med(prod["direct"]), 3),
        "tls_relay_consumer_throughput_ratio": round(med(cons["relay"]) / med(cons["direct"]), 3),
        "tls_relay_cpu_s_per_gb": {w: round(med(v), 2) for w, v in own["relay"].items()},
    }
    for workload, rates in (("producer", prod), ("consumer", cons)):
        by_round = [mine / theirs for mine, theirs in zip(rates["proxy"], rates["relay"], strict=True)]
        figures[f"tls_{workload}_to_relay"] = round(med(by_round), 3)
    if "baseline" in own:
        figures["baseline_cpu_s_per_gb"] = {w: round(med(v), 2) for w, v in own["baseline"].items()}
        for workload, rates in (("producer", prod), ("consumer", cons)):
            by_round = [mine / theirs for mine, theirs in zip(rates["proxy"], rates["baseline"], strict=True)]
            figures[f"tls_{workload}_to_baseline"] = round(med(by_round), 3)
    figures.update(
        rounds=args.rounds, records_per_run=args.records, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S")
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
