"""docs/config.md is what the config models say, every key is described, and every example loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.config_docs import (
    EXAMPLE_BASE,
    EXAMPLES,
    PAGE,
    QUOTAS_FILE_EXAMPLE,
    QUOTAS_FILE_MAIN,
    example_config,
    generate,
    missing_descriptions,
    rows,
    sections,
)
from proxy.config import ClusterQuotaConfig, ProxyConfig, load_config, parse_config


def test_page_is_what_the_models_say() -> None:
    """A model changed without the page (or the page edited by hand) fails here."""
    assert PAGE.read_text(encoding="utf-8") == generate(), (
        "docs/config.md is stale: run python dev/config_docs.py"
    )


def test_every_key_has_a_description() -> None:
    missing = missing_descriptions()
    assert not missing, (
        "config keys without a description (give the field a docstring in its model): " + ", ".join(missing)
    )


def test_every_section_has_an_example() -> None:
    """Each section of the page shows one; a new section needs one in dev/config_docs.EXAMPLES."""
    missing = [key for key, _, _ in sections() if key not in EXAMPLES]
    assert not missing, f"sections without an example in dev/config_docs.EXAMPLES: {missing}"


@pytest.mark.parametrize("section", sorted(EXAMPLES))
def test_example_loads(section: str) -> None:
    """The real loader accepts every example, so an example cannot drift from the models."""
    cfg = parse_config(example_config(section), f"docs/config.md, example of {section or 'top level'}")
    if section:
        assert section in cfg.model_fields_set, f"the example of {section} does not set it"


def test_quotas_file_example_loads(tmp_path: Path) -> None:
    """The quotas file example, named by a main file, through load_config as the proxy reads it."""
    (tmp_path / "quotas.yaml").write_text(QUOTAS_FILE_EXAMPLE, encoding="utf-8")
    main = tmp_path / "kthrottle.yaml"
    main.write_text(EXAMPLE_BASE + QUOTAS_FILE_MAIN, encoding="utf-8")
    cfg = load_config(main)
    assert cfg.quotas.clients["reporting"].consumer_byte_rate == 1048576


def test_deprecated_alias_is_shown_and_accepted() -> None:
    """``assumed_instances`` is the older name of ``cluster_quotas.replicas``: the page says so."""
    row = next(r for r in rows(ProxyConfig) if r.path == "cluster_quotas.replicas")
    assert row.also == ("assumed_instances",) and row.older
    assert ClusterQuotaConfig.model_validate({"assumed_instances": 3}).replicas == 3


def test_types_and_bounds_are_readable() -> None:
    by_path = {r.path: r for r in rows(ProxyConfig)}
    assert by_path["cluster_quotas.hot_interval_seconds"].type == "float > 0, <= 10"
    assert by_path["quotas.produce_shaping"].type == '"steady" | "kafka"'
    assert by_path["tls.principal_mapping_rules"].type == "list[str]"
    assert by_path["quotas.topics.<topic>.producer.byte.rate"].also == ("producer_byte_rate",)
    assert by_path["quotas.users.<user>.clients.<client-id>.producer_ids_rate"].default == "`null`"
