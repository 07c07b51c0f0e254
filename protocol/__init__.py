"""Kafka wire format: frames, headers and the messages kthrottle reads or changes. Sans-IO."""

from protocol.compiled import use_compiled

use_compiled(__name__, __path__)
