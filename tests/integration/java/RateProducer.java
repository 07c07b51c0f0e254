import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's own Java producer sending 1 KiB records as fast as it is let (Produce v13 names topics
 * by id), for the quota fidelity benchmark: how many value bytes were acknowledged at each moment.
 *
 * Usage: RateProducer BOOTSTRAP TOPIC CLIENT_ID SECONDS [key=value producer settings...]
 * Prints "AT elapsed_ms acked_bytes" every 250 ms, then "ERRORS n first-error".
 */
public class RateProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.CLIENT_ID_CONFIG, args[2]);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        long millis = Long.parseLong(args[3]) * 1000;
        byte[] value = new byte[1024];
        AtomicLong acked = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        String[] firstError = {""};
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
        Thread sender = new Thread(() -> {
            while (!Thread.currentThread().isInterrupted()) {
                try {
                    producer.send(new ProducerRecord<>(args[1], value), (md, e) -> {
                        if (e == null) {
                            acked.addAndGet(value.length);
                        } else if (errors.getAndIncrement() == 0) {
                            firstError[0] = e.toString();
                        }
                    });
                } catch (org.apache.kafka.common.errors.InterruptException e) {
                    return;
                }
            }
        });
        sender.setDaemon(true);
        long start = System.nanoTime();
        sender.start();
        long elapsed = 0;
        while (elapsed < millis) {
            Thread.sleep(250);
            elapsed = (System.nanoTime() - start) / 1_000_000;
            System.out.println("AT " + elapsed + " " + acked.get());
        }
        System.out.println("ERRORS " + errors.get() + " " + firstError[0]);
        System.out.flush();
        Runtime.getRuntime().halt(0);  // the backlog is the quota's business, not this run's
    }
}
