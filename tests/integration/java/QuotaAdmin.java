import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;

/**
 * Kafka's own Java admin client for the client-quota API tests (KIP-546).
 *
 * Usage: QuotaAdmin BOOTSTRAP PROPS_FILE|- alter|validate ENTITY KEY=VALUE|KEY=...
 *                                          describe [--strict] TYPE=NAME|TYPE=<default>|TYPE=*...
 * ENTITY is TYPE=NAME[,TYPE=NAME] (NAME <default>: the default entity); KEY= removes the key.
 * Prints "RESULT OK" or "RESULT ExceptionClass message" for an alteration; one
 * "ENTITY type=name,... VALUES key=value,..." line per described entity (sorted), or
 * "ERROR ExceptionClass message".
 */
public class QuotaAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        if (!args[1].equals("-")) {
            try (FileInputStream in = new FileInputStream(args[1])) {
                props.load(in);
            }
        }
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        String op = args[2];
        try (Admin admin = Admin.create(props)) {
            if (op.equals("alter") || op.equals("validate")) {
                Map<String, String> entity = new HashMap<>();
                for (String part : args[3].split(",")) {
                    String[] kv = part.split("=", 2);
                    entity.put(kv[0], kv[1].equals("<default>") ? null : kv[1]);
                }
                List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
                for (int i = 4; i < args.length; i++) {
                    String[] kv = args[i].split("=", 2);
                    ops.add(new ClientQuotaAlteration.Op(kv[0], kv[1].isEmpty() ? null : Double.valueOf(kv[1])));
                }
                ClientQuotaAlteration alteration = new ClientQuotaAlteration(new ClientQuotaEntity(entity), ops);
                KafkaFuture<Void> result = admin.alterClientQuotas(List.of(alteration),
                    new AlterClientQuotasOptions().validateOnly(op.equals("validate"))).all();
                try {
                    result.get();
                    System.out.println("RESULT OK");
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause();
                    System.out.println("RESULT " + cause.getClass().getSimpleName() + " " + cause.getMessage());
                }
            } else if (op.equals("describe")) {
                boolean strict = false;
                List<ClientQuotaFilterComponent> components = new ArrayList<>();
                for (int i = 3; i < args.length; i++) {
                    if (args[i].equals("--strict")) {
                        strict = true;
                        continue;
                    }
                    String[] kv = args[i].split("=", 2);
                    if (kv[1].equals("*")) {
                        components.add(ClientQuotaFilterComponent.ofEntityType(kv[0]));
                    } else if (kv[1].equals("<default>")) {
                        components.add(ClientQuotaFilterComponent.ofDefaultEntity(kv[0]));
                    } else {
                        components.add(ClientQuotaFilterComponent.ofEntity(kv[0], kv[1]));
                    }
                }
                ClientQuotaFilter filter = strict ? ClientQuotaFilter.containsOnly(components)
                    : ClientQuotaFilter.contains(components);
                try {
                    Map<ClientQuotaEntity, Map<String, Double>> found = admin.describeClientQuotas(filter).entities().get();
                    List<String> lines = new ArrayList<>();
                    for (Map.Entry<ClientQuotaEntity, Map<String, Double>> e : found.entrySet()) {
                        StringBuilder line = new StringBuilder("ENTITY ");
                        line.append(joined(new TreeMap<>(e.getKey().entries()))).append(" VALUES ");
                        line.append(joined(new TreeMap<>(e.getValue())));
                        lines.add(line.toString());
                    }
                    lines.sort(null);
                    lines.forEach(System.out::println);
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause();
                    System.out.println("ERROR " + cause.getClass().getSimpleName() + " " + cause.getMessage());
                }
            } else {
                throw new IllegalArgumentException("unknown operation " + op);
            }
        }
    }

    private static String joined(Map<String, ?> map) {
        StringBuilder out = new StringBuilder();
        for (Map.Entry<String, ?> e : map.entrySet()) {
            if (out.length() > 0) out.append(',');
            out.append(e.getKey()).append('=').append(e.getValue() == null ? "<default>" : e.getValue());
        }
        return out.toString();
    }
}
