"""Quota policy: rates, token buckets, entity resolution. Sans-IO (clock injected). Grows in issue 3."""
