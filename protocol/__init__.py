"""Kafka wire format: frames, headers and the messages kthrottle reads or changes. Sans-IO."""
