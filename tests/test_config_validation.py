"""Scheduler config (seed 004), scope item 1 of issue 4: schema and validation.

The seed's three examples validate into the expected objects; one invalid config per
validation rule, each with its exact path and message; several problems are reported at once;
hypothesis checks that nothing but ``ConfigError`` ever escapes; the CLI runs for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairpool.frontends.config import (
    MAX_PRIORITY,
    ROOT,
    ConfigError,
    ConfigIssue,
    FlavorQuotas,
    MatchExpression,
    OnViolation,
    Operator,
    Preemption,
    PreemptionPolicy,
    PriorityPolicy,
    Resource,
    ResourceFlavor,
    ResourceGroup,
    ResourceQueue,
    ResourceQuota,
    SchedulerConfig,
    SchedulingRule,
    load_config,
    validate_config,
    warnings,
)
from fairpool.frontends.config_diff import changed_queues, diff_configs, summary

# -- the seed's examples, verbatim (indentation restored) ------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scheduler"
# The seed's three examples, as a user would keep them.
COMPLETE_EXAMPLE = (EXAMPLES / "complete.yaml").read_text()
M5_CAP_EXAMPLE = (EXAMPLES / "m5-cap.yaml").read_text()
RESERVATION_EXAMPLE = (EXAMPLES / "reservation.yaml").read_text()

SEED_EXAMPLES = [COMPLETE_EXAMPLE, M5_CAP_EXAMPLE, RESERVATION_EXAMPLE]


def _in(key: str, *values: str) -> MatchExpression:
    return MatchExpression(key, Operator.IN, values)


def test_complete_example() -> None:
    config = load_config(COMPLETE_EXAMPLE)
    assert config == SchedulerConfig(
        resource_flavors=(
            ResourceFlavor(
                "gpu_a100_spot", (_in("accelerator-type", "A100"), _in("market-type", "SPOT"))
            ),
            ResourceFlavor("research_gpu_pool", (_in("team", "research"),)),
        ),
        resource_queues=(
            ResourceQueue(
                "ml_training",
                Preemption(PreemptionPolicy.LOWER_PRIORITY),
                (
                    ResourceGroup(
                        (Resource.GPU, Resource.CPU),
                        (
                            FlavorQuotas(
                                "gpu_a100_spot",
                                (
                                    ResourceQuota(Resource.GPU, 64_000),
                                    ResourceQuota(Resource.CPU, 512_000),
                                ),
                            ),
                            FlavorQuotas(
                                "research_gpu_pool",
                                (
                                    ResourceQuota(Resource.GPU, 16_000),
                                    ResourceQuota(Resource.CPU, 128_000),
                                ),
                            ),
                        ),
                    ),
                ),
            ),
            ResourceQueue("default"),
        ),
        scheduling_rules=(
            SchedulingRule(
                "ml_training",
                (_in("team", "research"),),
                PriorityPolicy(default=50, min=0, max=100, on_violation=OnViolation.REJECT),
            ),
            SchedulingRule("default"),
        ),
    )
    training, default = config.resource_queues
    assert training.preemption is not None and training.preemption.preempts_lower_priority
    assert not training.is_passthrough and default.is_passthrough
    assert config.scheduling_rules[1].is_catch_all
    assert not config.scheduling_rules[0].is_catch_all
    assert config.queue("ml_training") is training
    assert config.flavor("research_gpu_pool").selector == (_in("team", "research"),)
    gpu_quota = training.resource_groups[0].flavors[0].resources[0]
    assert gpu_quota.nominal_quota_milli == 64_000
    assert gpu_quota.nominal_quota == Decimal(64)
    assert warnings(config) == []


def test_m5_cap_example() -> None:
    config = load_config(M5_CAP_EXAMPLE)
    capped, default = config.resource_queues
    assert capped.name == "q-m5-2xlarge-cap3"
    assert capped.preemption == Preemption(PreemptionPolicy.NEVER)
    assert not capped.preemption.preempts_lower_priority
    (group,) = capped.resource_groups
    assert group.covered_resources == (Resource.CPU, Resource.MEMORY_GB)
    (flavor,) = group.flavors
    assert flavor.name == "m5-2xlarge"
    assert flavor.quota_milli("cpu") == 24_000  # 3 x 8 vCPU
    assert flavor.quota_milli(Resource.MEMORY_GB) == 96_000  # 3 x 32 GiB
    assert flavor.quota_milli("gpu") is None  # not covered, not quota'd
    assert default == ResourceQueue("default")
    assert config.flavor("m5-2xlarge").selector == (_in("instance-type", "m5.2xlarge"),)
    first, catch_all = config.scheduling_rules
    assert first.priority_policy == PriorityPolicy(50, 0, 100, OnViolation.FORCE_UPDATE)
    assert catch_all == SchedulingRule("default")
    assert warnings(config) == []


def test_capacity_reservation_example() -> None:
    config = load_config(RESERVATION_EXAMPLE)
    (flavor,) = config.resource_flavors
    assert flavor.name == "a4_reserved"
    assert flavor.selector == (_in("instance-type", "a4-highgpu-8g"),)
    # Opaque, verbatim, read-only.
    assert flavor.to_dict()["advanced_instance_config"] == {
        "instance_properties": {
            "reservation_affinity": {
                "key": "compute.googleapis.com/reservation-name",
                "consume_reservation_type": "SPECIFIC_RESERVATION",
                "values": ["my-a4-reservation"],
            }
        }
    }
    assert flavor.advanced_instance_config is not None
    with pytest.raises(TypeError):
        flavor.advanced_instance_config["x"] = 1  # type: ignore[index]
    reservation = config.queue("reservation")
    assert reservation.resource_groups == (
        ResourceGroup(
            (Resource.GPU,), (FlavorQuotas("a4_reserved", (ResourceQuota(Resource.GPU, 80_000),)),)
        ),
    )
    # "true" is quoted in the seed: a string label value, not a boolean.
    assert config.scheduling_rules[0].selector == (_in("use-reservation", "true"),)
    assert config.queue("default").is_passthrough
    assert warnings(config) == []


@pytest.mark.parametrize("text", SEED_EXAMPLES, ids=["complete", "m5-cap", "reservation"])
def test_seed_examples_round_trip(text: str) -> None:
    config = load_config(text)
    assert load_config(yaml.safe_dump(config.to_dict(), sort_keys=False)) == config
    assert validate_config(json.loads(json.dumps(config.to_dict()))) == config
    assert config.to_dict() == yaml.safe_load(text)  # the seed is already canonical


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "{}", "null", "~", "---\n"])
def test_empty_documents_are_valid_and_admit_everything(text: str) -> None:
    config = load_config(text)
    assert config == SchedulerConfig()
    assert config.to_dict() == {}
    assert warnings(config) == []


@pytest.mark.parametrize(
    ("written", "milli"),
    [
        ("64", 64_000),
        ("0.5", 500),
        ("0", 0),
        ("0.0", 0),
        ("0.001", 1),
        ("2.50", 2_500),
        ("1.5000", 1_500),  # trailing zeros are not decimal places
        ("0.1", 100),
        ("1_000.25", 1_000_250),
        ("12345678901.123", 12_345_678_901_123),
        ("999999999999.999", 999_999_999_999_999),
        ("1000000000000", 10**15),
        ("1.0e+3", 1_000_000),
        # JSON's exponents, which YAML 1.1 alone reads as strings
        ("1e3", 1_000_000),
        ("1E-2", 10),
        ("1.5e3", 1_500_000),
        ("-0e0", 0),
        ("0x10", 16_000),
    ],
)
def test_nominal_quota_becomes_exact_milli_units(written: str, milli: int) -> None:
    config = load_config(
        "resource_flavors: [{name: f}]\n"
        "resource_queues: [{name: q, resource_groups: [{covered_resources: [gpu], flavors: "
        f"[{{name: f, resources: [{{name: gpu, nominal_quota: {written}}}]}}]}}]}}]\n"
    )
    quota = config.resource_queues[0].resource_groups[0].flavors[0].resources[0]
    assert quota.nominal_quota_milli == milli
    assert isinstance(quota.nominal_quota_milli, int)
    # And back: to_dict gives a number that reads back to the same milli-units.
    again = load_config(yaml.safe_dump(config.to_dict()))
    assert again == config


def test_quota_from_an_already_parsed_float_uses_its_shortest_repr() -> None:
    group = {"covered_resources": ["gpu"], "flavors": [{"name": "f", "resources": []}]}
    group["flavors"][0]["resources"] = [{"name": "gpu", "nominal_quota": 0.1}]
    config = validate_config(
        {"resource_flavors": [{"name": "f"}], "resource_queues": [{"name": "q", "resource_groups": [group]}]}
    )
    assert config.resource_queues[0].resource_groups[0].flavors[0].quota_milli("gpu") == 100


def test_omitted_quota_is_unlimited_and_null_optional_fields_are_omitted() -> None:
    config = load_config(
        """
        resource_flavors: [{name: f, selector: null, advanced_instance_config: {}}]
        resource_queues:
          - name: q
            preemption: null
            resource_groups:
              - covered_resources: [gpu, cpu, memory_gb, tpu]
                flavors:
                  - name: f
                    resources: [{name: gpu}, {name: cpu, nominal_quota: null}, {name: tpu, nominal_quota: 0}]
        scheduling_rules: [{resource_queue: q, selector: [], priority_policy: {}}]
        """
    )
    (flavor,) = config.resource_flavors
    assert flavor.selector == () and flavor.advanced_instance_config == {}
    (quotas,) = config.resource_queues[0].resource_groups[0].flavors
    assert quotas.quota_milli("gpu") is None
    assert quotas.quota_milli("cpu") is None
    assert quotas.quota_milli("memory_gb") is None
    assert quotas.quota_milli("tpu") == 0  # 0 blocks
    assert config.resource_queues[0].preemption is None
    rule = config.scheduling_rules[0]
    assert rule.is_catch_all
    assert rule.priority_policy == PriorityPolicy()
    assert rule.priority_policy.effective_default == 0


def test_exists_operators_accept_an_empty_values_list_and_dates_stay_text() -> None:
    config = load_config(
        """
        resource_flavors:
          - name: f
            selector:
              - {key: spot, operator: exists, values: []}
              - {key: gpu, operator: does_not_exist}
              - {key: expires, operator: not_in, values: [2024-01-01, ""]}
        """
    )
    assert config.resource_flavors[0].selector == (
        MatchExpression("spot", Operator.EXISTS),
        MatchExpression("gpu", Operator.DOES_NOT_EXIST),
        MatchExpression("expires", Operator.NOT_IN, ("2024-01-01", "")),
    )


def test_yaml_anchors_and_merge_keys_work() -> None:
    config = load_config(
        """
        resource_flavors:
          - name: a
            selector: &research [{key: team, operator: in, values: [research]}]
          - name: b
            selector: *research
        resource_queues:
          - &base {name: q1}
          - <<: *base
            name: q2
        """
    )
    assert config.resource_flavors[0].selector == config.resource_flavors[1].selector
    assert [queue.name for queue in config.resource_queues] == ["q1", "q2"]


# -- one invalid config per rule -------------------------------------------------------------

FLAVORS = "resource_flavors: [{name: a}, {name: b}]\n"


def groups(flow: str) -> str:
    """A config with flavors a and b and one queue ``q`` with these resource groups."""
    return FLAVORS + f"resource_queues: [{{name: q, resource_groups: {flow}}}]\n"


def selector(flow: str) -> str:
    """A config with one flavor whose selector is this list."""
    return f"resource_flavors: [{{name: a, selector: {flow}}}]\n"


def policy(flow: str) -> str:
    """A config with one passthrough queue and one rule with this priority policy."""
    return f"resource_queues: [{{name: q}}]\nscheduling_rules: [{{resource_queue: q, priority_policy: {flow}}}]\n"


def quota(value: str) -> str:
    return groups(
        f"[{{covered_resources: [gpu], flavors: [{{name: a, resources: [{{name: gpu, nominal_quota: {value}}}]}}]}}]"
    )


GROUP = "resource_queues[0].resource_groups[0]"
QUOTA = f"{GROUP}.flavors[0].resources[0].nominal_quota"
EXPR = "resource_flavors[0].selector[0]"
PP = "scheduling_rules[0].priority_policy"

INVALID: list[tuple[str, str, str, str]] = [
    # (id, document, path, message)
    # -- the document
    ("document is a list", "- resource_flavors\n", ROOT,
     "the config must be a mapping with the keys resource_flavors, resource_queues and scheduling_rules (got a list)"),
    ("document is a string", "hello\n", ROOT,
     "the config must be a mapping with the keys resource_flavors, resource_queues and scheduling_rules (got string 'hello')"),
    ("yaml syntax error", "resource_flavors: [\n", ROOT,
     "invalid YAML: while parsing a flow node, expected the node content, but found '<stream end>' (line 2, column 1)"),
    ("yaml tab indentation", "resource_flavors:\n\t- name: a\n", ROOT,
     "invalid YAML: while scanning for the next token, found character '\\t' that cannot start any token (line 2, column 1)"),
    ("two yaml documents", "{}\n---\n{}\n", ROOT,
     "invalid YAML: expected a single document in the stream, but found another document (line 2, column 1)"),
    ("duplicate key", "resource_flavors: [{name: a}]\nresource_flavors: [{name: b}]\n", "resource_flavors",
     "duplicate key 'resource_flavors' on line 2 (first on line 1)"),
    ("duplicate nested key", "resource_queues:\n  - name: q\n    name: r\n", "resource_queues[0].name",
     "duplicate key 'name' on line 3 (first on line 2)"),
    ("duplicate merge key", "resource_flavors:\n  - <<: {name: a}\n    <<: {name: b}\n",
     'resource_flavors[0]["<<"]', "duplicate key '<<' on line 3 (first on line 2)"),
    # -- names print as they are: no control or other non-printing characters
    ("flavor name with a newline", 'resource_flavors: [{name: "ok\\n  - queue prod: removed"}]\n', "resource_flavors[0].name",
     "must not contain control or other non-printing characters (got 'ok\\n  - queue prod: removed', with U+000A)"),
    ("queue name with ESC", 'resource_queues: [{name: "p\\e[31m"}]\n', "resource_queues[0].name",
     "must not contain control or other non-printing characters (got 'p\\x1b[31m', with U+001B)"),
    ("flavor reference with a tab", 'resource_flavors: [{name: a}]\nresource_queues: [{name: q, resource_groups: [{covered_resources: [gpu], flavors: [{name: "a\\t"}]}]}]\n',
     "resource_queues[0].resource_groups[0].flavors[0].name",
     "must not contain control or other non-printing characters (got 'a\\t', with U+0009)"),
    ("rule resource_queue with DEL", 'resource_queues: [{name: q}]\nscheduling_rules: [{resource_queue: "q\\x7f"}]\n',
     "scheduling_rules[0].resource_queue", "must not contain control or other non-printing characters (got 'q\\x7f', with U+007F)"),
    ("selector key with a bidi override", 'resource_flavors: [{name: a, selector: [{key: "\\u202ez", operator: exists}]}]\n',
     "resource_flavors[0].selector[0].key", "must not contain control or other non-printing characters (got '\\u202ez', with U+202E)"),
    # -- values are shown as written, not as YAML 1.1 reads them
    ("octal as written", "resource_flavors: [{name: a, selector: [{key: z, operator: in, values: [010]}]}]\n",
     "resource_flavors[0].selector[0].values[0]", "must be a string (got integer 010; quote it to make it a string)"),
    ("base 60 as written", "resource_flavors: [{name: a, selector: [{key: z, operator: in, values: [1:30]}]}]\n",
     "resource_flavors[0].selector[0].values[0]", "must be a string (got integer 1:30; quote it to make it a string)"),
    ("yes as written", "resource_flavors: [{name: a, selector: [{key: z, operator: in, values: [yes]}]}]\n",
     "resource_flavors[0].selector[0].values[0]", "must be a string (got boolean yes; quote it to make it a string)"),
    ("a JSON exponent is a number", "resource_flavors: [{name: 1e3}]\n",
     "resource_flavors[0].name", "must be a string (got number 1e3; quote it to make it a string)"),
    ("a list as written", "resource_flavors: 0x1F\n", "resource_flavors", "must be a list (got integer 0x1F)"),
    ("the document as written", "1:30\n", ROOT,
     "the config must be a mapping with the keys resource_flavors, resource_queues and scheduling_rules (got integer 1:30)"),
    ("as written through an alias", "resource_flavors: [{name: a, advanced_instance_config: {n: &n 0x1F}}, {name: *n}]\n",
     "resource_flavors[1].name", "must be a string (got integer 0x1F; quote it to make it a string)"),
    ("unknown top-level key", "resource_flavours: []\n", "resource_flavours",
     "unknown key 'resource_flavours'; did you mean 'resource_flavors'?"),
    ("unknown key from the API (recycle_policy)", "recycle_policy: {}\n", "recycle_policy",
     "unknown key 'recycle_policy'; allowed keys: resource_flavors, resource_queues, scheduling_rules"),
    ("non-string key", "1: x\n", "[1]",
     "unknown key integer 1; allowed keys: resource_flavors, resource_queues, scheduling_rules"),
    ("resource_flavors not a list", "resource_flavors: {name: a}\n", "resource_flavors",
     "must be a list (got a mapping)"),
    # -- resource_flavors
    ("flavor not a mapping", "resource_flavors: [a]\n", "resource_flavors[0]", "must be a mapping (got string 'a')"),
    ("flavor name missing", "resource_flavors: [{selector: []}]\n", "resource_flavors[0].name", "is required"),
    ("flavor name null", "resource_flavors: [{name: null}]\n", "resource_flavors[0].name", "is required (got null)"),
    ("flavor name empty", "resource_flavors: [{name: ''}]\n", "resource_flavors[0].name", "must not be empty"),
    ("flavor name ..", "resource_flavors: [{name: ..}]\n", "resource_flavors[0].name",
     'must not be "." or "..": URLs drop such a path segment'),
    ("flavor name not a string", "resource_flavors: [{name: 5}]\n", "resource_flavors[0].name",
     "must be a string (got integer 5; quote it to make it a string)"),
    ("flavor name with NUL", 'resource_flavors: [{name: "a\\0b"}]\n', "resource_flavors[0].name",
     "must not contain NUL characters"),
    ("flavor name too long", f"resource_flavors: [{{name: {'x' * 256}}}]\n", "resource_flavors[0].name",
     "must be at most 255 characters (got 256)"),
    ("flavor unknown key", "resource_flavors: [{name: a, requirements: []}]\n", "resource_flavors[0].requirements",
     "unknown key 'requirements'; allowed keys: name, selector, advanced_instance_config"),
    ("flavor names unique", "resource_flavors: [{name: a}, {name: b}, {name: a}]\n", "resource_flavors[2].name",
     "duplicate flavor name 'a' (first defined at resource_flavors[0])"),
    ("advanced_instance_config not a mapping", "resource_flavors: [{name: a, advanced_instance_config: [x]}]\n",
     "resource_flavors[0].advanced_instance_config", "must be a mapping (got a list)"),
    ("advanced_instance_config non-string key", "resource_flavors: [{name: a, advanced_instance_config: {tags: {1: x}}}]\n",
     "resource_flavors[0].advanced_instance_config.tags[1]", "keys must be strings (got integer 1)"),
    ("advanced_instance_config not JSON (nan)", "resource_flavors: [{name: a, advanced_instance_config: {x: .nan}}]\n",
     "resource_flavors[0].advanced_instance_config.x", "must be a finite number (got number .nan)"),
    ("advanced_instance_config recursive alias", "resource_flavors: [{name: a, advanced_instance_config: &c {self: *c}}]\n",
     "resource_flavors[0].advanced_instance_config.self", "must not contain itself (recursive YAML alias)"),
    # -- match expressions
    ("selector not a list", "resource_flavors: [{name: a, selector: {key: team}}]\n", "resource_flavors[0].selector",
     "must be a list (got a mapping)"),
    ("expression not a mapping", selector("[team]"), EXPR, "must be a mapping (got string 'team')"),
    ("expression key missing", selector("[{operator: exists}]"), f"{EXPR}.key", "is required"),
    ("expression key empty", selector("[{key: '', operator: exists}]"), f"{EXPR}.key", "must not be empty"),
    ("expression key not a string", selector("[{key: [a], operator: exists}]"), f"{EXPR}.key", "must be a string (got a list)"),
    ("expression operator missing", selector("[{key: team, values: [a]}]"), f"{EXPR}.operator", "is required"),
    ("expression operator Kueue spelling", selector("[{key: team, operator: In, values: [a]}]"), f"{EXPR}.operator",
     "must be one of in, not_in, exists, does_not_exist (got 'In'; did you mean 'in'?)"),
    ("expression operator NotIn", selector("[{key: team, operator: NotIn, values: [a]}]"), f"{EXPR}.operator",
     "must be one of in, not_in, exists, does_not_exist (got 'NotIn'; did you mean 'not_in'?)"),
    ("expression operator unknown", selector("[{key: team, operator: gt, values: [a]}]"), f"{EXPR}.operator",
     "must be one of in, not_in, exists, does_not_exist (got 'gt')"),
    ("in without values", selector("[{key: team, operator: in}]"), f"{EXPR}.values", "is required for operator 'in'"),
    ("not_in with null values", selector("[{key: team, operator: not_in, values: null}]"), f"{EXPR}.values",
     "is required for operator 'not_in'"),
    ("in with empty values", selector("[{key: team, operator: in, values: []}]"), f"{EXPR}.values",
     "must not be empty for operator 'in'"),
    ("exists with values", selector("[{key: team, operator: exists, values: [a]}]"), f"{EXPR}.values",
     "must be omitted for operator 'exists'"),
    ("does_not_exist with values", selector("[{key: team, operator: does_not_exist, values: [a]}]"), f"{EXPR}.values",
     "must be omitted for operator 'does_not_exist'"),
    ("values not a list", selector("[{key: team, operator: in, values: research}]"), f"{EXPR}.values",
     "must be a list (got string 'research')"),
    ("value not a string (YAML boolean)", selector("[{key: use-reservation, operator: in, values: [true]}]"),
     f"{EXPR}.values[0]", "must be a string (got boolean true; quote it to make it a string)"),
    ("expression unknown key", selector("[{key: team, operator: exists, value: [a]}]"), f"{EXPR}.value",
     "unknown key 'value'; did you mean 'values'?"),
    # -- resource_queues
    ("queue name missing", "resource_queues: [{preemption: {}}]\n", "resource_queues[0].name", "is required"),
    ("queue name empty", "resource_queues: [{name: ''}]\n", "resource_queues[0].name", "must not be empty"),
    ("queue name with a slash", "resource_queues: [{name: team/q}]\n", "resource_queues[0].name",
     'must not contain "/": the API addresses it in URL paths'),
    ("queue name .", "resource_queues: [{name: .}]\n", "resource_queues[0].name",
     'must not be "." or "..": URLs drop such a path segment'),
    ("queue name ..", "resource_queues: [{name: ..}]\n", "resource_queues[0].name",
     'must not be "." or "..": URLs drop such a path segment'),
    ("queue names unique", "resource_queues: [{name: q}, {name: q}]\n", "resource_queues[1].name",
     "duplicate queue name 'q' (first defined at resource_queues[0])"),
    ("queue unknown key (cohort_name)", "resource_queues: [{name: q, cohort_name: c}]\n", "resource_queues[0].cohort_name",
     "unknown key 'cohort_name'; allowed keys: name, preemption, resource_groups"),
    ("preemption not a mapping", "resource_queues: [{name: q, preemption: never}]\n", "resource_queues[0].preemption",
     "must be a mapping (got string 'never')"),
    ("preemption value", "resource_queues: [{name: q, preemption: {within_resource_queue: any}}]\n",
     "resource_queues[0].preemption.within_resource_queue", "must be one of never, lower_priority (got 'any')"),
    ("preemption unknown key", "resource_queues: [{name: q, preemption: {reclaim_within_cohort: any}}]\n",
     "resource_queues[0].preemption.reclaim_within_cohort", "unknown key 'reclaim_within_cohort'; allowed keys: within_resource_queue"),
    ("resource_groups not a list", "resource_queues: [{name: q, resource_groups: {}}]\n",
     "resource_queues[0].resource_groups", "must be a list (got a mapping)"),
    ("group unknown key", groups("[{covered_resources: [gpu], flavors: [{name: a}], cohort: x}]"), f"{GROUP}.cohort",
     "unknown key 'cohort'; allowed keys: covered_resources, flavors"),
    # -- covered_resources
    ("covered_resources missing", groups("[{flavors: [{name: a}]}]"), f"{GROUP}.covered_resources", "is required"),
    ("covered_resources empty", groups("[{covered_resources: [], flavors: [{name: a}]}]"), f"{GROUP}.covered_resources",
     "must not be empty"),
    ("covered_resources not a list", groups("[{covered_resources: gpu, flavors: [{name: a}]}]"),
     f"{GROUP}.covered_resources", "must be a list (got string 'gpu')"),
    ("covered resource unknown (memory)", groups("[{covered_resources: [memory], flavors: [{name: a}]}]"),
     f"{GROUP}.covered_resources[0]", "must be one of gpu, cpu, memory_gb, tpu (got 'memory'; did you mean 'memory_gb'?)"),
    ("covered resource case-sensitive", groups("[{covered_resources: [CPU], flavors: [{name: a}]}]"),
     f"{GROUP}.covered_resources[0]", "must be one of gpu, cpu, memory_gb, tpu (got 'CPU'; did you mean 'cpu'?)"),
    ("covered resource custom", groups("[{covered_resources: [nvidia.com/gpu], flavors: [{name: a}]}]"),
     f"{GROUP}.covered_resources[0]", "must be one of gpu, cpu, memory_gb, tpu (got 'nvidia.com/gpu')"),
    ("covered_resources duplicates", groups("[{covered_resources: [gpu, cpu, gpu], flavors: [{name: a}]}]"),
     f"{GROUP}.covered_resources[2]", "duplicate resource 'gpu' (also covered_resources[0])"),
    ("covered sets disjoint", groups("[{covered_resources: [gpu], flavors: [{name: a}]}, {covered_resources: [cpu, gpu], flavors: [{name: b}]}]"),
     "resource_queues[0].resource_groups[1].covered_resources[1]",
     "resource 'gpu' is already covered by resource_groups[0] of this queue (covered sets must be disjoint)"),
    # -- flavors of a group
    ("group flavors missing", groups("[{covered_resources: [gpu]}]"), f"{GROUP}.flavors", "is required"),
    ("group flavors empty", groups("[{covered_resources: [gpu], flavors: []}]"), f"{GROUP}.flavors", "must not be empty"),
    ("group flavor name missing", groups("[{covered_resources: [gpu], flavors: [{resources: []}]}]"),
     f"{GROUP}.flavors[0].name", "is required"),
    ("group flavor unknown key", groups("[{covered_resources: [gpu], flavors: [{name: a, quota: 1}]}]"),
     f"{GROUP}.flavors[0].quota", "unknown key 'quota'; allowed keys: name, resources"),
    ("flavor reference resolves", groups("[{covered_resources: [gpu], flavors: [{name: c}]}]"),
     f"{GROUP}.flavors[0].name", "unknown flavor 'c'; defined flavors: a, b"),
    ("flavor reference with no flavors", "resource_queues: [{name: q, resource_groups: [{covered_resources: [gpu], flavors: [{name: a}]}]}]\n",
     f"{GROUP}.flavors[0].name", "unknown flavor 'a'; no flavors are defined"),
    ("flavor once per group", groups("[{covered_resources: [gpu], flavors: [{name: a}, {name: b}, {name: a}]}]"),
     f"{GROUP}.flavors[2].name", "flavor 'a' appears more than once in this resource group (also flavors[0])"),
    ("flavor once across groups", groups("[{covered_resources: [gpu], flavors: [{name: a}]}, {covered_resources: [cpu], flavors: [{name: a}]}]"),
     "resource_queues[0].resource_groups[1].flavors[0].name",
     "flavor 'a' is already used by resource_groups[0] of this queue (a flavor appears at most once across a queue's groups)"),
    # -- resources of a flavor
    ("resources not a list", groups("[{covered_resources: [gpu], flavors: [{name: a, resources: {gpu: 8}}]}]"),
     f"{GROUP}.flavors[0].resources", "must be a list (got a mapping)"),
    ("resource name missing", groups("[{covered_resources: [gpu], flavors: [{name: a, resources: [{nominal_quota: 8}]}]}]"),
     f"{GROUP}.flavors[0].resources[0].name", "is required"),
    ("resource outside covered set", groups("[{covered_resources: [gpu, cpu], flavors: [{name: a, resources: [{name: tpu, nominal_quota: 8}]}]}]"),
     f"{GROUP}.flavors[0].resources[0].name", "resource 'tpu' is not in this group's covered_resources (gpu, cpu)"),
    ("resource name not a resource", groups("[{covered_resources: [memory_gb], flavors: [{name: a, resources: [{name: memory, nominal_quota: 8}]}]}]"),
     f"{GROUP}.flavors[0].resources[0].name",
     "must be one of gpu, cpu, memory_gb, tpu (got 'memory'; did you mean 'memory_gb'?)"),
    ("resource names unique", groups("[{covered_resources: [gpu], flavors: [{name: a, resources: [{name: gpu, nominal_quota: 8}, {name: gpu, nominal_quota: 4}]}]}]"),
     f"{GROUP}.flavors[0].resources[1].name", "duplicate resource 'gpu' in this flavor (also resources[0])"),
    ("resource unknown key (lending_limit)", groups("[{covered_resources: [gpu], flavors: [{name: a, resources: [{name: gpu, lending_limit: 2}]}]}]"),
     f"{GROUP}.flavors[0].resources[0].lending_limit", "unknown key 'lending_limit'; allowed keys: name, nominal_quota"),
    # -- nominal_quota
    ("quota negative", quota("-1"), QUOTA, "must be >= 0 (got -1)"),
    ("quota negative fraction", quota("-0.5"), QUOTA, "must be >= 0 (got -0.5)"),
    ("quota 4 decimals", quota("0.1234"), QUOTA, "must have at most 3 decimal places (got 0.1234)"),
    ("quota tiny", quota("1.0e-4"), QUOTA, "must have at most 3 decimal places (got 0.00010)"),
    ("quota boolean", quota("true"), QUOTA, "must be a number (got boolean true)"),
    ("quota string", quota("'8'"), QUOTA, "must be a number (got string '8')"),
    ("quota with unit", quota("8Gi"), QUOTA, "must be a number (got string '8Gi')"),
    ("quota infinite", quota(".inf"), QUOTA, "must be a finite number (got number .inf)"),
    # Read as 0.0, it was taken: a quota that blocks the flavor.
    ("quota below a float's range", quota("1e-400"), QUOTA,
     "1e-400 is out of a number's range: it reads as 0.0"),
    ("quota too large", quota("10000000000001"), QUOTA, "must be at most 1000000000000 (got 10000000000001)"),
    ("quota a list", quota("[8]"), QUOTA, "must be a number (got a list)"),
    # -- scheduling_rules
    ("scheduling_rules not a list", "scheduling_rules: {resource_queue: q}\n", "scheduling_rules",
     "must be a list (got a mapping)"),
    ("rule resource_queue missing", "scheduling_rules: [{selector: []}]\n", "scheduling_rules[0].resource_queue", "is required"),
    ("rule resource_queue empty", "scheduling_rules: [{resource_queue: ''}]\n", "scheduling_rules[0].resource_queue",
     "must not be empty"),
    ("rule resource_queue resolves", "resource_queues: [{name: q}, {name: default}]\nscheduling_rules: [{resource_queue: r}]\n",
     "scheduling_rules[0].resource_queue", "unknown queue 'r'; defined queues: default, q"),
    ("rule unknown key", "resource_queues: [{name: q}]\nscheduling_rules: [{resource_queue: q, priority: 5}]\n",
     "scheduling_rules[0].priority", "unknown key 'priority'; did you mean 'priority_policy'?"),
    ("rule selector expression", "resource_queues: [{name: q}]\nscheduling_rules: [{resource_queue: q, selector: [{key: team, operator: in}]}]\n",
     "scheduling_rules[0].selector[0].values", "is required for operator 'in'"),
    # -- priority_policy
    ("priority_policy not a mapping", policy("50"), PP, "must be a mapping (got integer 50)"),
    ("priority_policy unknown key", policy("{default: 5, maximum: 10}"), f"{PP}.maximum", "unknown key 'maximum'; did you mean 'max'?"),
    ("priority negative", policy("{min: -1}"), f"{PP}.min", "must be >= 0 (got -1)"),
    ("priority not an integer", policy("{default: 1.5}"), f"{PP}.default", "must be an integer >= 0 (got number 1.5)"),
    ("priority integral float", policy("{max: 100.0}"), f"{PP}.max", "must be an integer >= 0 (got number 100.0)"),
    ("priority boolean", policy("{default: true}"), f"{PP}.default", "must be an integer >= 0 (got boolean true)"),
    ("priority string", policy("{default: '5'}"), f"{PP}.default", "must be an integer >= 0 (got string '5')"),
    ("priority too large", policy(f"{{max: {MAX_PRIORITY + 1}}}"), f"{PP}.max", f"must be at most {MAX_PRIORITY} (got integer {MAX_PRIORITY + 1})"),
    ("min <= max", policy("{min: 60, max: 50}"), f"{PP}.min", "min (60) must be <= max (50)"),
    # The seed: default "If unset, 0", and min <= default (a warning until 2026-11-30).
    ("min <= an unset default", policy("{min: 10, max: 100}"), f"{PP}.default",
     "default (unset: 0) must be >= min (10): set one in range"),
    # A default refused is not also "unset" (a second, false problem: helper-83).
    ("min <= a refused default", policy("{default: 50.0, min: 10, max: 100}"), f"{PP}.default",
     "must be an integer >= 0 (got number 50.0)"),
    ("default >= min", policy("{default: 5, min: 10}"), f"{PP}.default", "default (5) must be >= min (10)"),
    ("default <= max", policy("{default: 150, max: 100}"), f"{PP}.default", "default (150) must be <= max (100)"),
    # Compared values are shown as written, not as YAML read them (16, 1000).
    ("min <= max as written", policy("{min: 0x10, max: 1_0}"), f"{PP}.min", "min (0x10) must be <= max (1_0)"),
    ("default >= min as written", policy("{default: 0x1, min: 1_000}"), f"{PP}.default",
     "default (0x1) must be >= min (1_000)"),
    # -- numbers only YAML 1.1 reads so (JSON refuses them; YAML 1.2 reads 10 and text)
    ("priority octal", policy("{min: 010, max: 7}"), f"{PP}.min", "010 is octal in YAML 1.1 (8): write 8, or 10 for decimal"),
    ("priority base 60", policy("{min: 1:30, max: 7}"), f"{PP}.min", "1:30 is base 60 in YAML 1.1 (90): write 90"),
    ("priority octal zero", policy("{default: 00}"), f"{PP}.default", "00 is octal in YAML 1.1 (0): write 0"),
    ("quota octal", quota("010"), QUOTA, "010 is octal in YAML 1.1 (8): write 8, or 10 for decimal"),
    ("quota octal negative", quota("-0_10"), QUOTA, "-0_10 is octal in YAML 1.1 (-8): write -8, or -10 for decimal"),
    ("quota base 60 float", quota("1:30.5"), QUOTA, "1:30.5 is base 60 in YAML 1.1 (90.5): write 90.5"),
    ("advanced_instance_config octal", "resource_flavors: [{name: a, advanced_instance_config: {count: [010]}}]\n",
     "resource_flavors[0].advanced_instance_config.count[0]", "010 is octal in YAML 1.1 (8): write 8, or 10 for decimal"),
    ("on_violation value", policy("{on_violation: clamp}"), f"{PP}.on_violation", "must be one of reject, force_update (got 'clamp')"),
    ("on_violation spelling", policy("{on_violation: force-update}"), f"{PP}.on_violation",
     "must be one of reject, force_update (got 'force-update'; did you mean 'force_update'?)"),
]


@pytest.mark.parametrize(
    ("document", "path", "message"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_each_rule_has_a_failing_example(document: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(document)
    assert caught.value.pairs() == [(path, message)]


def test_the_invalid_table_covers_enough_rules() -> None:
    assert len(INVALID) >= 30
    assert len({case[0] for case in INVALID}) == len(INVALID)


def test_every_problem_is_reported_at_once_in_document_order_with_lines() -> None:
    document = textwrap.dedent(
        """\
        resource_flavors:
          - name: gpu_a100_spot
            selectors: []
          - name: gpu_a100_spot
        resource_queues:
          - name: ml_training
            resource_groups:
              - covered_resources: [gpu, cpu]
                flavors:
                  - name: gpu_a100_spot
                    resources:
                      - { name: gpu, nominal_quota: 64 }
                      - { name: cpu, nominal_quota: 512.0001 }
                      - { name: tpu, nominal_quota: 8 }
              - covered_resources: [cpu]
                flavors:
                  - name: nope
        scheduling_rules:
          - selector:
              - { key: team, operator: exists, values: [research] }
            resource_queue: ml_trainin
            priority_policy: { default: 50, min: 0, max: 10, on_violation: reject }
          - resource_queue: default
        """
    )
    with pytest.raises(ConfigError) as caught:
        load_config(document)
    q = "resource_queues[0].resource_groups"
    assert [(issue.line, issue.path, issue.message) for issue in caught.value.errors] == [
        (3, "resource_flavors[0].selectors", "unknown key 'selectors'; did you mean 'selector'?"),
        (4, "resource_flavors[1].name", "duplicate flavor name 'gpu_a100_spot' (first defined at resource_flavors[0])"),
        (13, f"{q}[0].flavors[0].resources[1].nominal_quota", "must have at most 3 decimal places (got 512.0001)"),
        (14, f"{q}[0].flavors[0].resources[2].name", "resource 'tpu' is not in this group's covered_resources (gpu, cpu)"),
        (15, f"{q}[1].covered_resources[0]", "resource 'cpu' is already covered by resource_groups[0] of this queue (covered sets must be disjoint)"),
        (17, f"{q}[1].flavors[0].name", "unknown flavor 'nope'; defined flavors: gpu_a100_spot"),
        (20, "scheduling_rules[0].selector[0].values", "must be omitted for operator 'exists'"),
        (21, "scheduling_rules[0].resource_queue", "unknown queue 'ml_trainin'; defined queues: ml_training"),
        (22, "scheduling_rules[0].priority_policy.default", "default (50) must be <= max (10)"),
        (23, "scheduling_rules[1].resource_queue", "unknown queue 'default'; defined queues: ml_training"),
    ]
    # The exception is also one line for the CLI's generic error handler.
    assert str(caught.value).startswith("invalid scheduler config (10 problems): resource_flavors[0]")
    assert "\n" not in str(caught.value)


def test_a_wrong_covered_resource_hides_none_of_the_flavors_problems() -> None:
    """One wrong entry (``memory``) made the flavors' subset check pass every name: the
    resources outside the group were reported only once it was fixed (found by helper-69)."""
    with pytest.raises(ConfigError) as caught:
        load_config(GROUPS.replace("[gpu, cpu]", "[gpu, memory, gpu]")
                    % "[{name: tpu, nominal_quota: 1}, {name: cpu, nominal_quota: 1}]")
    assert [(issue.path.rsplit(".", 2)[-2:], issue.message) for issue in caught.value.errors] == [
        (["resource_groups[0]", "covered_resources[1]"],
         "must be one of gpu, cpu, memory_gb, tpu (got 'memory'; did you mean 'memory_gb'?)"),
        (["resource_groups[0]", "covered_resources[2]"],
         "duplicate resource 'gpu' (also covered_resources[0])"),
        (["resources[0]", "name"], "resource 'tpu' is not in this group's covered_resources (gpu)"),
        (["resources[1]", "name"], "resource 'cpu' is not in this group's covered_resources (gpu)"),
    ]


def test_a_mappings_own_problems_keep_document_order_with_its_fields() -> None:
    """Unknown keys and cross-field rules are found after a mapping's fields, and reported
    where they stand in the text."""
    document = textwrap.dedent(
        """\
        resource_flavors:
          - name: b
            advanced_instance_config: 5
            foo: 1
        resource_queues: [{name: q}]
        scheduling_rules:
          - resource_queue: q
            priority_policy:
              default: 150
              max: 100
              on_violation: clamp
        """
    )
    with pytest.raises(ConfigError) as caught:
        load_config(document)
    assert [(issue.line, issue.path) for issue in caught.value.errors] == [
        (3, "resource_flavors[0].advanced_instance_config"),
        (4, "resource_flavors[0].foo"),
        (9, "scheduling_rules[0].priority_policy.default"),
        (11, "scheduling_rules[0].priority_policy.on_violation"),
    ]


def test_duplicate_keys_are_reported_with_the_other_problems() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("resource_queues:\n  - name: q\n    name: q\nscheduling_rules: [{resource_queue: r}]\n")
    assert caught.value.pairs() == [
        ("resource_queues[0].name", "duplicate key 'name' on line 3 (first on line 2)"),
        ("scheduling_rules[0].resource_queue", "unknown queue 'r'; defined queues: q"),
    ]


def test_a_broken_list_does_not_cascade_into_reference_errors() -> None:
    # resource_flavors is broken: queue flavor references are not checked against it.
    with pytest.raises(ConfigError) as caught:
        load_config(groups("[{covered_resources: [gpu], flavors: [{name: zzz}]}]").replace(FLAVORS, "resource_flavors: 3\n"))
    assert caught.value.pairs() == [("resource_flavors", "must be a list (got integer 3)")]


def test_unparseable_values_and_deep_nesting_are_one_yaml_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("resource_flavors: [{name: !!int abc}]\n")
    ((path, message),) = caught.value.pairs()
    assert path == ROOT and message.startswith("invalid YAML: cannot read abc as int:")
    assert message.endswith("(line 1, column 27)")  # the tag
    with pytest.raises(ConfigError) as caught:
        load_config("[" * 5000 + "]" * 5000)
    assert caught.value.pairs()[0][0] == ROOT


def test_alias_bombs_are_cheap() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = "resource_flavors:\n  - name: f\n    advanced_instance_config:\n" + "".join(
        f"      {line}\n" for line in lines
    )
    with pytest.raises(ConfigError) as caught:
        load_config(bomb)
    too_large = "too large: the document's advanced_instance_config values number more than 100000"
    assert caught.value.pairs()[-1][1] == too_large


def test_flavors_aliasing_one_large_anchor_share_one_budget() -> None:
    """Each flavor had a budget of its own: 14 KB of flavors aliasing one anchor of 59,000
    values took 14 s and 320 MB to check (any token may ask ``POST /config/validate``)."""
    anchor = "[" + ",".join(["1"] * 20_000) + "]"
    flavors = [
        f"  - {{name: f{i}, advanced_instance_config: "
        f"{'{a: &big ' + anchor + '}' if i == 0 else '{a: *big}'}}}\n"
        for i in range(5)
    ]
    with pytest.raises(ConfigError) as caught:
        load_config("resource_flavors:\n" + "".join(flavors))
    ((path, message),) = caught.value.pairs()
    assert path.startswith("resource_flavors[4].advanced_instance_config.a[")
    assert message == (
        "too large: the document's advanced_instance_config values number more than 100000"
    )
    # Under the budget, every flavor keeps its copy.
    config = load_config("resource_flavors:\n" + "".join(flavors[:4]))
    assert [len(f.advanced_instance_config["a"]) for f in config.resource_flavors] == [20_000] * 4


# -- warnings --------------------------------------------------------------------------------


def test_warnings() -> None:
    config = load_config(
        """
        resource_flavors:
          - {name: used, selector: [{key: accelerator_type, operator: in, values: [A100]}]}
          - {name: unused}
        resource_queues:
          - name: capped
            resource_groups: [{covered_resources: [gpu], flavors: [{name: used}]}]
          - {name: orphan, preemption: {within_resource_queue: lower_priority}}
        scheduling_rules:
          - {resource_queue: capped,
             priority_policy: {default: 10, min: 10, max: 100, on_violation: reject}}
          - {resource_queue: capped}
          - {resource_queue: capped, selector: [{key: Team, operator: exists}]}
        """
    )
    assert [(issue.path, issue.message) for issue in warnings(config)] == [
        ("scheduling_rules[0]", "catch-all rule at index 0 is not last: rules after it only see workloads whose priority it rejects"),
        ("scheduling_rules[1]", "catch-all rule at index 1 is not last: rules after it never match"),
        ("resource_flavors[1]", "flavor 'unused' is not used by any resource queue"),
        ("resource_queues[1]", "queue 'orphan' is not the target of any scheduling rule"),
        ("resource_queues[1].preemption", "queue 'orphan' is a passthrough (no resource_groups): it admits everything and never preempts"),
        ("resource_flavors[0].selector[0].key", "label key 'accelerator_type' is not the reserved key 'accelerator-type': keys are case-sensitive and reserved keys are hyphenated"),
    ]


def test_warning_without_catch_all_rule_and_without_rules() -> None:
    no_catch_all = load_config(
        "resource_queues: [{name: q}]\n"
        "scheduling_rules: [{resource_queue: q, selector: [{key: team, operator: exists}]}]\n"
    )
    assert warnings(no_catch_all) == [
        ConfigIssue("scheduling_rules", "no catch-all rule (a rule without selector): workloads matching no rule fail")
    ]
    no_rules = load_config("resource_queues: [{name: q}]\n")
    assert warnings(no_rules) == [
        ConfigIssue("scheduling_rules", "no scheduling rules: every workload is admitted without quota and the resource_queues are never used")
    ]


# -- nothing but ConfigError escapes ---------------------------------------------------------

YAMLISH = st.lists(
    st.sampled_from(
        [
            "resource_flavors", "resource_queues", "scheduling_rules", "name", "selector",
            "resource_groups", "covered_resources", "flavors", "resources", "nominal_quota",
            "priority_policy", "min", "max", "default", "key", "operator", "values", "in", "gpu",
            ": ", ":", "- ", "-", "\n", "\n  ", "  ", "[", "]", "{", "}", ", ", "&a ", "*a", "!!int ",
            "!!binary ", "<<: ", "? ", "'", '"', "#", "|", ">", "0.5", "1e3", "-1", ".inf", "null",
            "true", "~", "\t", "%YAML 1.1\n", "---\n", "...\n", "\\0", "é", "\x00", "\ud800",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=200), YAMLISH))
def test_load_config_only_raises_config_error_on_any_text(text: str) -> None:
    _load_or_config_error(text)


SCHEMA_KEYS = st.sampled_from(
    [
        "resource_flavors", "resource_queues", "scheduling_rules", "name", "selector",
        "advanced_instance_config", "preemption", "within_resource_queue", "resource_groups",
        "covered_resources", "flavors", "resources", "nominal_quota", "resource_queue",
        "priority_policy", "default", "min", "max", "on_violation", "key", "operator", "values",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(),
    st.text(max_size=10),
    st.sampled_from(["gpu", "cpu", "memory_gb", "in", "exists", "reject", "never", "a", "q"]),
)
JSONISH = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.one_of(SCHEMA_KEYS, st.text(max_size=5)), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSONISH)
def test_load_config_only_raises_config_error_on_any_json_like_value(value: Any) -> None:
    _load_or_config_error(yaml.safe_dump(value, allow_unicode=True))
    _validate_or_config_error(value)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    result = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            result += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            result += _paths(item, (*path, index))
    return result


def _replace(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[head] = _replace(document[head], tuple(rest), value)
    return copy


SEED_DOCUMENTS = [yaml.safe_load(text) for text in SEED_EXAMPLES]


@st.composite
def mutated_seed_documents(draw: st.DrawFn) -> Any:
    document = draw(st.sampled_from(SEED_DOCUMENTS))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(document)))
        document = _replace(document, path, draw(JSONISH))
    return document


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_seed_documents())
def test_mutated_seed_examples_fail_cleanly_or_round_trip(document: Any) -> None:
    config = _load_or_config_error(yaml.safe_dump(document, allow_unicode=True))
    if config is not None:
        assert load_config(yaml.safe_dump(config.to_dict(), allow_unicode=True)) == config
        warnings(config)


def _load_or_config_error(text: str) -> SchedulerConfig | None:
    try:
        return load_config(text)
    except ConfigError as error:
        _check_error(error)
        return None


def _validate_or_config_error(value: Any) -> None:
    try:
        validate_config(value)
    except ConfigError as error:
        _check_error(error)


def _check_error(error: ConfigError) -> None:
    assert error.errors
    for issue in error.errors:
        assert issue.path and issue.message
        str(issue).encode("utf-8")  # printable as is
    json.dumps([issue.as_dict() for issue in error.errors])


# -- the CLI, for real -----------------------------------------------------------------------

CLI = [sys.executable, "-m", "fairpool.cli.main", "config", "validate"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_validate_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(COMPLETE_EXAMPLE.replace("  - resource_queue: default", "  - resource_queue: ml_training\n    selector: [{key: team, operator: exists}]"))
    result = _run("-f", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Config is valid: 2 flavors, 2 queues, 2 rules.\n"
    assert result.stderr.splitlines() == [
        "Warning: scheduling_rules: no catch-all rule (a rule without selector): workloads matching no rule fail",
        "Warning: resource_queues[1]: queue 'default' is not the target of any scheduling rule",
    ]


def test_cli_validate_invalid_file_lists_every_error(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(
        COMPLETE_EXAMPLE.replace("nominal_quota: 64", "nominal_quota: 64.0005")
        .replace("operator: in, values: [SPOT]", "operator: exists, values: [SPOT]")
        .replace("resource_queue: default", "resource_queue: defualt")
    )
    expected = [
        ("resource_flavors[0].selector[1].values", "must be omitted for operator 'exists'"),
        ("resource_queues[0].resource_groups[0].flavors[0].resources[0].nominal_quota",
         "must have at most 3 decimal places (got 64.0005)"),
        ("scheduling_rules[1].resource_queue", "unknown queue 'defualt'; defined queues: default, ml_training"),
    ]
    result = _run("-f", str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"Error: {path} is not a valid scheduler config (3 problems):",
        *(f"{p}: {m}" for p, m in expected),
    ]
    result = _run("--file", str(path), "-o", "json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert [(e["path"], e["message"]) for e in report["errors"]] == expected
    assert [e["line"] for e in report["errors"]] == [7, 21, 35]


def test_cli_validate_missing_file(tmp_path: Path) -> None:
    result = _run("-f", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"Error: cannot read {tmp_path / 'nope.yaml'}: No such file or directory\n"


def test_cli_validate_a_json_document_with_exponent_numbers(tmp_path: Path) -> None:
    """JSON is YAML too: ``1e3`` is the number 1000, as ``json.load`` reads it."""
    document = {
        "resource_flavors": [{"name": "a"}],
        "resource_queues": [{"name": "q", "resource_groups": [{"covered_resources": ["gpu"], "flavors": [
            {"name": "a", "resources": [{"name": "gpu", "nominal_quota": "QUOTA"}]}]}]}],
        "scheduling_rules": [{"resource_queue": "q"}],
    }
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps(document).replace('"QUOTA"', "1e3"))
    assert json.loads(path.read_text())["resource_queues"][0]["resource_groups"][0]["flavors"][0][
        "resources"][0]["nominal_quota"] == 1000
    result = _run("-f", str(path))
    assert result.returncode == 0, result.stderr
    assert load_config(path.read_text()).resource_queues[0].resource_groups[0].flavors[0].quota_milli(
        "gpu") == 1_000_000


@pytest.mark.parametrize(
    ("document", "reading"),
    [
        ('resource_queues: [{name: "p\\e[31m"}]\n', {"resource_queues": [{"name": "p\x1b[31m"}]}),
        ("resource_flavors:\n  - <<: {name: a}\n    <<: {name: b}\n", {"resource_flavors": [{"name": "b"}]}),
        ("resource_flavors: [{name: 1e3}]\n", {"resource_flavors": [{"name": "1e3"}]}),
        # Applied with a warning until 2026-11-30.
        ("resource_queues: [{name: q}]\n"
         "scheduling_rules: [{resource_queue: q, priority_policy: {min: 10}}]\n",
         {"resource_queues": [{"name": "q"}],
          "scheduling_rules": [{"resource_queue": "q", "priority_policy": {"min": 10}}]}),
        # Applied until 2026-12-02.
        ("resource_queues: [{name: ..}]\n", {"resource_queues": [{"name": ".."}]}),
    ],
    ids=["non-printing name", "second merge key", "1e3 as text", "min over an unset default",
         "a queue named .."],
)
def test_a_stored_version_reads_as_when_it_was_applied(document: str, reading: dict[str, Any]) -> None:
    """What rules added since 2026-11-29 refuse, a version applied before may hold: it must
    still load (each pass reads the active version, each apply every version)."""
    with pytest.raises(ConfigError):
        load_config(document)
    assert load_config(document, stored=True).to_dict() == reading


def test_a_stored_version_applied_since_reads_by_todays_rules() -> None:
    """``1e3`` applied today is the number it was read as: read by the older rules (text),
    the version every pass and apply reads again was refused, and no apply succeeded."""
    document = GROUPS % "[{name: gpu, nominal_quota: 1e1}]"
    assert load_config(document, stored=True) == load_config(document)
    assert load_config(document, stored=True).resource_queues[0].resource_groups[0].flavors[
        0].quota_milli("gpu") == 10_000


PASSTHROUGH = "resource_queues:\n  - name: p\n"
GROUPS = ("resource_flavors: [{name: f}]\nresource_queues:\n  - name: q\n"
          "    resource_groups: [{covered_resources: [gpu, cpu], flavors: [{name: f, resources: %s}]}]\n")


@pytest.mark.parametrize(
    ("document", "as_read"),
    [
        (GROUPS % "[{name: gpu, nominal_quota: 010}, {name: cpu, nominal_quota: 2}]",
         GROUPS % "[{name: gpu, nominal_quota: 8}, {name: cpu, nominal_quota: 2}]"),
        ("resource_flavors: [{name: a, advanced_instance_config: {n: 1:30, m: 1e1}}]\n",
         "resource_flavors: [{name: a, advanced_instance_config: {n: 90, m: '1e1'}}]\n"),
        ("resource_queues: [{name: q}]\nscheduling_rules: [{resource_queue: q, priority_policy: {min: 010, default: 9}}]\n",
         "resource_queues: [{name: q}]\nscheduling_rules: [{resource_queue: q, priority_policy: {min: 8, default: 9}}]\n"),
    ],
    ids=["octal quota", "base 60 in advanced_instance_config", "octal priority"],
)
def test_a_stored_version_with_yaml_11_numbers_reads_as_when_it_was_applied(document: str, as_read: str) -> None:
    """Applied before 2026-11-29, a version holds YAML 1.1's 8 and 90 for ``010`` and
    ``1:30``, and ``1e1`` as text, as they were read then."""
    with pytest.raises(ConfigError):
        load_config(document)
    assert load_config(document, stored=True) == load_config(as_read)


@pytest.mark.parametrize(
    ("before", "after", "path"),
    [
        # Equivalent spellings: the same queue, no change.
        (PASSTHROUGH, PASSTHROUGH + "    preemption: {within_resource_queue: never}\n", None),
        (PASSTHROUGH, PASSTHROUGH + "    preemption: {}\n", None),
        (PASSTHROUGH, PASSTHROUGH + "    preemption:\n    resource_groups: []\n", None),
        (GROUPS % "[]", GROUPS % "[{name: gpu}]", None),
        (GROUPS % "[{name: gpu, nominal_quota: 1}, {name: cpu, nominal_quota: 2}]",
         (GROUPS % "[{name: cpu, nominal_quota: 2.0}, {name: gpu, nominal_quota: 1}]")
         .replace("[gpu, cpu]", "[cpu, gpu]"), None),
        # Real changes, at the field that changes.
        (PASSTHROUGH, PASSTHROUGH + "    preemption: {within_resource_queue: lower_priority}\n",
         "resource_queues[0].preemption"),
        (GROUPS % "[]", GROUPS % "[{name: gpu, nominal_quota: 1}]", "resource_queues[0].resource_groups"),
    ],
)
def test_a_queue_spec_is_compared_as_what_it_does(before: str, after: str, path: str | None) -> None:
    old, new = load_config(before), load_config(after)
    stored = json.loads(json.dumps(summary(old)))  # as a version's record holds it
    problems = changed_queues([(1, stored["queue_specs"])], new)
    assert [issue.path for issue in problems] == ([] if path is None else [path])
    assert bool(diff_configs(old, new)) == (path is not None)


def test_a_stored_version_past_todays_opaque_budget_still_loads() -> None:
    """Applied before 2026-11-29, ten flavors could each alias 11,111 values (each flavor had
    a budget of its own): read back, the version still loads."""
    anchor = "{a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], " + ", ".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 4)
    ) + "}"
    document = "resource_flavors:\n" + "".join(
        f"  - {{name: f{i}, advanced_instance_config: {'&big ' + anchor if i == 0 else '*big'}}}\n"
        for i in range(10)
    )
    with pytest.raises(ConfigError):
        load_config(document)
    flavors = load_config(document, stored=True).resource_flavors
    assert len(flavors) == 10
    assert all(len(f.advanced_instance_config["a3"]) == 10 for f in flavors)
    # Applied between the two changes of 2026-11-29, ``1e3`` is a number in it: read back
    # by today's rules with that budget, not by the earlier ones, which read text (and
    # refused the quota: every pass and apply failed).
    applied = document.replace("advanced_instance_config: *big", "advanced_instance_config: "
                               "{disk_gb: 1e3, a: *big}") + (
        "resource_queues:\n  - name: q\n    resource_groups: [{covered_resources: [gpu], "
        "flavors: [{name: f0, resources: [{name: gpu, nominal_quota: 1e3}]}]}]\n")
    with pytest.raises(ConfigError):
        load_config(applied)
    config = load_config(applied, stored=True)
    assert config.resource_queues[0].resource_groups[0].flavors[0].quota_milli("gpu") == 1_000_000
    assert config.resource_flavors[1].advanced_instance_config["disk_gb"] == 1000.0
