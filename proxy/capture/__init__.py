"""Capture sinks: the records the proxy keeps of what it saw (files, a Kafka topic) and their
export. Stands on net."""
