"""Quota policy: rates, token buckets, entity resolution. Sans-IO (clock injected)."""

from protocol.compiled import use_compiled

use_compiled(__name__, __path__)
