"""One client connection: the pipeline, its flow control and frame streams, and the stages each
request passes. Stands on net, shared and capture; knows the server only through ``host.Host``."""

from protocol.compiled import use_compiled

use_compiled(__name__, __path__)
