import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.CreatePartitionsOptions;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DeleteTopicsOptions;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;
import org.apache.kafka.common.errors.ThrottlingQuotaExceededException;

/**
 * Kafka's own Java admin client, with retryOnQuotaViolation off, for the mutation quota tests.
 *
 * Usage: MutationAdmin BOOTSTRAP CLIENT_ID create|validate NAME:PARTITIONS...
 *                                          partitions NAME:TOTAL...
 *                                          delete NAME...
 *                                          sequence [await-quota] NAME:PARTITIONS...
 * "sequence" creates the topics one request at a time; a throttled one is retried after the
 * throttle time it was given, printing "STEP name attempt OK|Exception throttleMs atMs" per
 * request, atMs the milliseconds from the sequence's first request to this one's sending.
 * "sequence-spread" does the same with a new admin client (new connections) for every request,
 * so that behind a load balancer the requests reach different gateway replicas.
 * With await-quota it first waits until the cluster shows a controller_mutation_rate for
 * CLIENT_ID, so a quota just set on the broker is in force.
 * Prints one line per topic: "RESULT name OK" or "RESULT name ExceptionClass throttleMs message".
 */
public class MutationAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        String op = args[2];
        Map<String, KafkaFuture<Void>> results = new HashMap<>();
        List<String> order = new ArrayList<>();
        try (Admin admin = Admin.create(props)) {
            if (op.equals("sequence") || op.equals("sequence-spread")) {
                sequence(admin, op.equals("sequence-spread") ? props : null, args[1], args);
                return;
            }
            if (op.equals("create") || op.equals("validate")) {
                List<NewTopic> topics = new ArrayList<>();
                for (int i = 3; i < args.length; i++) {
                    String[] parts = args[i].split(":");
                    topics.add(new NewTopic(parts[0], Integer.parseInt(parts[1]), (short) 1));
                    order.add(parts[0]);
                }
                CreateTopicsOptions options = new CreateTopicsOptions().retryOnQuotaViolation(false)
                    .validateOnly(op.equals("validate"));
                results.putAll(admin.createTopics(topics, options).values());
            } else if (op.equals("partitions")) {
                Map<String, NewPartitions> topics = new LinkedHashMap<>();  // the order given
                for (int i = 3; i < args.length; i++) {
                    String[] parts = args[i].split(":");
                    topics.put(parts[0], NewPartitions.increaseTo(Integer.parseInt(parts[1])));
                    order.add(parts[0]);
                }
                results.putAll(admin.createPartitions(topics, new CreatePartitionsOptions().retryOnQuotaViolation(false)).values());
            } else if (op.equals("delete")) {
                for (int i = 3; i < args.length; i++) {
                    order.add(args[i]);
                }
                results.putAll(admin.deleteTopics(order, new DeleteTopicsOptions().retryOnQuotaViolation(false))
                    .topicNameValues());
            } else {
                throw new IllegalArgumentException("unknown operation " + op);
            }
            for (String name : order) {
                try {
                    results.get(name).get();
                    System.out.println("RESULT " + name + " OK");
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause();
                    int throttle = cause instanceof ThrottlingQuotaExceededException
                        ? ((ThrottlingQuotaExceededException) cause).throttleTimeMs() : 0;
                    System.out.println("RESULT " + name + " " + cause.getClass().getSimpleName() + " " + throttle
                        + " " + cause.getMessage());
                }
            }
        }
    }

    private static void sequence(Admin admin, Properties spread, String clientId, String[] args)
            throws Exception {
        int first = 3;
        if (args.length > 3 && args[3].equals("await-quota")) {
            awaitQuota(admin, clientId);
            first = 4;
        }
        long started = 0;
        for (int i = first; i < args.length; i++) {
            String[] parts = args[i].split(":");
            NewTopic topic = new NewTopic(parts[0], Integer.parseInt(parts[1]), (short) 1);
            CreateTopicsOptions options = new CreateTopicsOptions().retryOnQuotaViolation(false);
            for (int attempt = 1; ; attempt++) {
                Admin each = spread == null ? admin : Admin.create(spread);
                if (spread != null) {
                    each.describeCluster().nodes().get();  // connected before the clock starts
                }
                long sent = System.currentTimeMillis();
                if (started == 0) {
                    started = sent;
                }
                String at = " " + (sent - started);
                try {
                    each.createTopics(Collections.singletonList(topic), options).all().get();
                    System.out.println("STEP " + parts[0] + " " + attempt + " OK 0" + at);
                    break;
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause();
                    if (!(cause instanceof ThrottlingQuotaExceededException) || attempt >= 10) {
                        System.out.println("STEP " + parts[0] + " " + attempt + " "
                            + cause.getClass().getSimpleName() + " 0" + at);
                        break;
                    }
                    int throttle = ((ThrottlingQuotaExceededException) cause).throttleTimeMs();
                    System.out.println("STEP " + parts[0] + " " + attempt + " "
                        + cause.getClass().getSimpleName() + " " + throttle + at);
                    Thread.sleep(throttle);
                } finally {
                    if (each != admin) {
                        each.close();
                    }
                }
            }
        }
    }

    private static void awaitQuota(Admin admin, String clientId) throws Exception {
        ClientQuotaFilter filter = ClientQuotaFilter.containsOnly(Collections.singletonList(
            ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.CLIENT_ID, clientId)));
        long deadline = System.currentTimeMillis() + 30_000;
        while (System.currentTimeMillis() < deadline) {
            for (Map<String, Double> quotas : admin.describeClientQuotas(filter).entities().get().values()) {
                if (quotas.containsKey("controller_mutation_rate")) {
                    return;
                }
            }
            Thread.sleep(100);
        }
        throw new IllegalStateException("no controller_mutation_rate for " + clientId + " after 30 s");
    }
}
