"""The operator's side: admin HTTP endpoints, the quota CLI, per-entity quota metrics. Stands on
every room below it; sees the server only as a type."""
