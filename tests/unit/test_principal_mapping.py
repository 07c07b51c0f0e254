"""Kafka's ssl.principal.mapping.rules and the RFC 2253 name of a certificate subject."""

from __future__ import annotations

import pytest

from quota.principal_mapping import NoMatchingRule, PrincipalMapper, distinguished_name

SUBJECT = (
    (("countryName", "US"),),
    (("organizationName", "Example, Inc."),),
    (("organizationalUnitName", "eng"),),
    (("commonName", "Alice"),),
)


def test_subject_printed_as_java_does_most_specific_first_and_escaped() -> None:
    assert distinguished_name(SUBJECT) == "CN=Alice,OU=eng,O=Example\\, Inc.,C=US"


def test_multi_valued_rdn_and_unknown_attribute() -> None:
    subject = ((("commonName", "bob"), ("userId", "42")), (("emailAddress", "b@x"),))
    assert distinguished_name(subject) == "emailAddress=b@x,CN=bob+UID=42"


def test_default_keeps_the_name() -> None:
    assert PrincipalMapper().name("CN=Alice,OU=eng") == "CN=Alice,OU=eng"


def test_rules_in_order_with_groups_and_case() -> None:
    mapper = PrincipalMapper(["RULE:^CN=([^,]+),OU=ops.*$/ops-$1/U", "RULE:^CN=([^,]+),.*$/$1/L", "DEFAULT"])
    assert mapper.name("CN=Alice,OU=eng,C=US") == "alice"
    assert mapper.name("CN=Bob,OU=ops,C=US") == "OPS-BOB"
    assert mapper.name("O=nobody") == "O=nobody"  # the first two need a CN first: DEFAULT


def test_kafka_doc_example_with_two_groups() -> None:
    mapper = PrincipalMapper(["RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L", "DEFAULT"])
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,L=City,ST=State,C=US") == "duke@serviceusers"


def test_pattern_must_match_the_whole_name() -> None:
    mapper = PrincipalMapper(["RULE:CN=admin/root/"])
    assert mapper.name("CN=admin") == "root"
    with pytest.raises(NoMatchingRule):
        mapper.name("CN=admin,OU=x")  # a partial match is no match, and no rule is left


def test_back_reference_beyond_the_groups_stays_literal_and_escapes_work() -> None:
    mapper = PrincipalMapper([r"RULE:^CN=(\w+)$/$1-$2\$/"])
    assert mapper.name("CN=ann") == "ann-$2$"


def test_slash_in_a_pattern_is_escaped() -> None:
    mapper = PrincipalMapper([r"RULE:^CN=a\/b$/ab/"])
    assert mapper.name("CN=a/b") == "ab"


@pytest.mark.parametrize("rule", ["RULE:CN=x", "RULE:(/x/", "NOPE", "RULE:a/b/X"])
def test_bad_rules_refused(rule: str) -> None:
    with pytest.raises(ValueError):
        PrincipalMapper([rule])


def test_no_rules_refused() -> None:
    with pytest.raises(ValueError):
        PrincipalMapper([])
