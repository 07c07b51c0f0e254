"""State shared across connections and gateway replicas: the quota enforcer, the exchange topic,
cluster-wide quotas, volume limits, topic names and ids, the Kafka quota Admin API. Stands on net."""
