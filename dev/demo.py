"""The demo: a real Kafka broker, kthrottle in front of it, a client producing and consuming through it.

Run with `bash dev/demo.sh` (it sets everything up first). Options: --brokers N, --messages N,
--keep (leave broker and proxy running until Ctrl-C so you can point your own tools at them).
"""

from __future__ import annotations

import argparse
import itertools
import signal
import time

from dev.harness import KafkaCluster
from dev.kafka_python_group import group_consumer
from dev.proxy_process import ProxyProcess, gateway_config


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", flush=True)


def race(proxy: ProxyProcess, seconds: int, quota_kib: int) -> None:
    """Two producers at full speed, one with a quota: print both rates live, as delivered."""
    import threading

    from kafka import KafkaProducer

    say(
        f"two producers race for {seconds}s; 'throttled-demo' has producer_byte_rate = {quota_kib} KiB/s, "
        "'free-demo' has no quota"
    )
    delivered = {"throttled-demo": 0, "free-demo": 0}
    stop = threading.Event()
    payload = b"d" * 1024

    def run(client_id: str) -> None:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id=client_id, acks=1, linger_ms=5)

        def ok(_md: object) -> None:
            delivered[client_id] += len(payload)

        while not stop.is_set():
            producer.send("race", payload).add_callback(ok)
        producer.close()

    threads = [threading.Thread(target=run, args=(c,)) for c in delivered]
    for t in threads:
        t.start()
    history = [dict(delivered)]
    print(f"{'second':>6}  {'throttled-demo KiB/s':>21}  {'(last 11 s)':>11}  {'free-demo KiB/s':>16}")
    for second in range(1, seconds + 1):
        time.sleep(1)
        history.append(dict(delivered))
        now, prev, old = history[-1], history[-2], history[max(0, len(history) - 12)]
        rate = {c: (now[c] - prev[c]) / 1024 for c in now}
        avg = (now["throttled-demo"] - old["throttled-demo"]) / 1024 / min(11, len(history) - 1)
        print(
            f"{second:>6}  {rate['throttled-demo']:>21.0f}  {avg:>11.0f}  {rate['free-demo']:>16.0f}",
            flush=True,
        )
    final = history[-1]
    stop.set()
    for t in threads:
        t.join()
    free = final["free-demo"] / 1024 / seconds
    throttle = proxy.metric("kthrottle_client_throttle_time_ms_total", {"client_id": "free-demo"})
    say(
        f"free-demo (no quota): {free:.0f} KiB/s on average over {seconds}s; throttle sent: {throttle:.0f} ms"
    )
    explain_throttled([h["throttled-demo"] for h in history], quota_kib * 1024)
    throttle = proxy.metric("kthrottle_client_throttle_time_ms_total", {"client_id": "throttled-demo"})
    say(f"throttled-demo: throttle_time_ms sent to it summed to {throttle / 1000:.1f}s")


def explain_throttled(delivered: list[int], quota: float, burst_seconds: float = 10.0) -> None:
    """Say what the throttled client got, in its two parts: the burst a Kafka quota allows at the
    start (quota x (quota.window.num - 1) x window size: 10 s of the quota at Kafka's defaults),
    then the held rate; the average over the whole race is neither."""
    seconds = len(delivered) - 1
    per_second = [b - a for a, b in itertools.pairwise(delivered)]
    # The burst is spent at the first second the client got no more than a little over its quota.
    spent = next((s for s, got in enumerate(per_second) if got <= 1.2 * quota), None)
    if spent is None or spent >= seconds - 2:
        say(f"throttled-demo never settled at its quota within {seconds}s: run longer (--seconds)")
        return
    burst = delivered[spent] - quota * spent
    held = (delivered[-1] - delivered[spent]) / (seconds - spent)
    mib = 1024 * 1024
    say(
        f"throttled-demo, burst: {delivered[spent] / mib:.1f} MiB in its first {spent}s, "
        f"{burst / mib:.1f} MiB above its quota (a Kafka quota allows {burst_seconds:.0f}s of the quota, "
        f"{quota * burst_seconds / mib:.1f} MiB, before it holds a client: quota.window.num 11 x 1 s)"
    )
    say(
        f"throttled-demo, held: {held / 1024:.0f} KiB/s over seconds {spent}-{seconds} against its "
        f"quota of {quota / 1024:.0f} KiB/s ({(held / quota - 1) * 100:+.1f}%)"
    )
    say(
        f"throttled-demo, average over the whole {seconds}s: {delivered[-1] / 1024 / seconds:.0f} KiB/s, "
        "the burst spread over the race: as a broker with that quota would give it"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=20, help="how long the two producers race")
    parser.add_argument(
        "--quota-kib", type=int, default=512, help="producer_byte_rate of the throttled client"
    )
    parser.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    args = parser.parse_args()

    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    say(f"starting a {args.brokers}-node Apache Kafka cluster (KRaft) on free loopback ports")
    began = time.monotonic()
    with KafkaCluster(brokers=args.brokers) as cluster:
        say(f"broker(s) up in {time.monotonic() - began:.1f}s at {cluster.bootstrap_servers}")
        quotas = {"clients": {"throttled-demo": {"producer_byte_rate": args.quota_kib * 1024}}}
        with ProxyProcess(gateway_config(cluster, quotas=quotas)) as proxy:
            say(
                f"kthrottle listening: bootstrap {proxy.bootstrap}, per-broker ports "
                f"{ {k: v for k, v in proxy.ports.items() if k != 'bootstrap'} }, admin :{proxy.admin_port}"
            )
            say(f"config: {proxy.config_path}")

            admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
            admin.create_topics([NewTopic("demo", 3, min(3, args.brokers))])
            admin.close()
            say("created topic 'demo' through the proxy")

            producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", enable_idempotence=True)
            t0 = time.monotonic()
            for i in range(args.messages):
                producer.send("demo", key=f"user-{i % 10}".encode(), value=f"event {i}".encode())
            producer.flush()
            brokers_seen = sorted(f"{b.host}:{b.port}" for b in producer._metadata.brokers())
            producer.close()
            say(
                f"produced {args.messages} messages in {time.monotonic() - t0:.2f}s; "
                f"the client only ever saw proxy addresses: {brokers_seen}"
            )

            consumer = group_consumer(
                "demo",
                bootstrap_servers=proxy.bootstrap,
                group_id="demo-group",
                auto_offset_reset="earliest",
                consumer_timeout_ms=5000,
            )
            got = [(r.key, r.value) for r in consumer]
            consumer.close()
            say(f"consumed {len(got)} messages back in a consumer group; first: {got[0] if got else None}")
            assert len(got) == args.messages, f"expected {args.messages}, got {len(got)}"

            race(proxy, args.seconds, args.quota_kib)

            for api in ("Produce", "Fetch", "Metadata"):
                n = proxy.metric("kthrottle_requests_total", {"api": api})
                say(f'kthrottle_requests_total{{api="{api}"}} = {n:.0f}')
            say(
                f"metrics: http://127.0.0.1:{proxy.admin_port}/metrics  readiness: "
                f"{proxy.admin_get('/readyz')[1]}"
            )
            if args.keep:
                say("running; Ctrl-C to stop")
                signal.sigwait({signal.SIGINT, signal.SIGTERM})
    say("stopped broker and proxy; demo done")


if __name__ == "__main__":
    main()
