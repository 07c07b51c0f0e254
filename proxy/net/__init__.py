"""Sockets, TLS and the upstream side: listeners' transports, the PROXY protocol, who a client
is, the broker directory and the small client the proxy's own requests use. Imports the proxy's
basics only (config, secrets, ratelog, metrics)."""

from protocol.compiled import use_compiled

use_compiled(__name__, __path__)
