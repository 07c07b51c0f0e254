import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Kafka's own Java consumer (Fetch v13+ names topics by id) reading a topic for a while, for the
 * topic-quota tests: how many value bytes it had received at each moment, and the throttle it saw.
 *
 * Usage: RateConsumer BOOTSTRAP TOPIC CLIENT_ID SECONDS [key=value consumer settings...]
 * Prints "AT elapsed_ms bytes" after every poll, then "THROTTLE_MAX ms".
 */
public class RateConsumer {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, args[2]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "g-" + args[1]);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        long seconds = Long.parseLong(args[3]);
        long bytes = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[1]));
            long start = System.nanoTime();
            long elapsed = 0;
            while (elapsed < seconds * 1000) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(250));
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    bytes += record.value() == null ? 0 : record.value().length;
                }
                elapsed = (System.nanoTime() - start) / 1_000_000;
                System.out.println("AT " + elapsed + " " + bytes);
            }
            double throttle = 0;
            for (Map.Entry<MetricName, ? extends Metric> e : consumer.metrics().entrySet()) {
                if (e.getKey().name().equals("fetch-throttle-time-max")) {
                    Object v = e.getValue().metricValue();
                    if (v instanceof Double d && !d.isNaN()) {
                        throttle = Math.max(throttle, d);
                    }
                }
            }
            System.out.println("THROTTLE_MAX " + throttle);
        }
    }
}
