"""Consumer-group guard rails (``join_group_rate``, ``rejoin_group_rate``, ``sync_group_rate``,
``offset_commit_rate``): a group request whose entity owes waits in the proxy, so the group
coordinator never sees more than the rate (a consumer crash-looping rejoins the group on every
start, and every join rebalances all its members); one let through is charged and answered with
the throttle its charge left. Only the keys with a rate configured are looked at, and a
JoinGroup's body only for its member id."""

from __future__ import annotations

from collections.abc import Collection

from protocol.api_keys import ApiKey, api_name
from proxy.pipeline.stages.base import Connection, Request, Stage
from proxy.shared.throttling import QuotaEnforcer
from quota.group_requests import quota_key


class GroupRequestStage(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer) -> None:
        self.conn = conn
        self.enforcer = enforcer

    def request_keys(self) -> Collection[int]:
        groups = self.enforcer.groups
        return groups.api_keys if groups.active else ()

    def on_request(self, req: Request) -> bool:
        header = req.header
        api = header.api_key
        member_id = str(req.body.get("member_id") or "") if api == ApiKey.JOIN_GROUP else None
        key = quota_key(api, member_id)
        enforcer, conn = self.enforcer, self.conn
        if key not in enforcer.groups.keys:
            return False
        name = api_name(api) or str(api)
        wait = enforcer.group_request_wait(key, conn.user, req.client_id, name, req.exempt)
        if wait:
            conn.wait_before(req.frame, wait)  # read again once its bucket owes nothing
            return True
        throttle = enforcer.on_group_request(key, conn.user, req.client_id, name, req.exempt)
        req.throttle_ms = max(req.throttle_ms, throttle)
        return False
