"""Kafka's ssl.principal.mapping.rules and the RFC 2253 name of a certificate subject."""

from __future__ import annotations

from pathlib import Path

import pytest

from quota.principal_mapping import (
    BadCertificate,
    NoMatchingRule,
    PrincipalMapper,
    distinguished_name,
    subject_of_certificate,
)

# Subjects (DER) and the names Java 17's X500Principal.getName() gave for them (Dn.java, run once).
BASIC = bytes.fromhex(
    "3043310b300906035504061302555331163014060355040a0c0d4578616d706c652c20496e632e310c300a0603"
    "55040b0c03656e67310e300c06035504030c05416c696365"
)
TRICKY = bytes.fromhex(
    "3081a6310b3009060355040613025553311b301906092a864886f70d010901160c616c6963654065782e636f6d31"
    "2a300f060a0992268993f22c6401010c0137301706035504030c10613d6223633b642b6522665c673c683e3117"
    "3015060a0992268993f22c64011916076578616d706c653117300906035504070c02234c300a06035504090c03"
    "207820311c300a06035504051303313233300e06035504080c075ac3bc72696368"
)


def test_subject_printed_as_java_prints_it() -> None:
    assert distinguished_name(BASIC) == "CN=Alice,OU=eng,O=Example\\, Inc.,C=US"


def test_other_attributes_hex_and_java_escaping() -> None:
    assert distinguished_name(TRICKY) == (
        "2.5.4.5=#1303313233+ST=Zürich,L=\\#L+STREET=\\ x\\ ,DC=example,"
        'UID=7+CN=a\\=b\\#c\\;d\\+e\\"f\\\\g\\<h\\>,1.2.840.113549.1.9.1=#160c616c6963654065782e636f6d,C=US'
    )


def test_subject_read_from_a_real_certificate(tmp_path: Path) -> None:
    import ssl

    from dev.certs import CertificateAuthority

    files = CertificateAuthority(tmp_path).issue("c", "Alice", org_unit="clients")
    der = ssl.PEM_cert_to_DER_cert(
        files.cert.read_text().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    )
    assert distinguished_name(subject_of_certificate(der)) == "CN=Alice,OU=clients,O=kthrottle tests,C=US"


@pytest.mark.parametrize(
    "junk",
    [b"\x30\x07\x31\x05\x30\x03\x06\x01\x81", b"", b"\x30", b"\x30\x05\x31\x03", b"\x30\x84\xff\xff\xff\xff"],
)
def test_unreadable_der_is_a_bad_certificate(junk: bytes) -> None:
    with pytest.raises(BadCertificate):
        distinguished_name(junk)
    with pytest.raises(BadCertificate):
        subject_of_certificate(junk)


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
