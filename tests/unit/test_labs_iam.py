"""tests/labs/iam.py: IAM's decision on a request by identity-based policies and a permissions
boundary, rule by rule as AWS's documentation gives it, and PolicyError wherever the evaluator
cannot decide as AWS would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.iam import PolicyError, Request, allowed, evaluate

BUCKET = "arn:aws:s3:::cloudtrain-123"
OBJECT = f"{BUCKET}/jobs/AROAEXAMPLE:i-0abc/job-1/final.json"
USERID = "AROAEXAMPLE:i-0abc"


def _statement(effect: str, action: object = "*", resource: object = "*",
               condition: dict | None = None) -> dict:
    statement = {"Effect": effect, "Action": action, "Resource": resource}
    if condition is not None:
        statement["Condition"] = condition
    return statement


def _policy(*statements: dict, version: str | None = "2012-10-17") -> dict:
    document: dict = {"Statement": list(statements)}
    if version is not None:
        document["Version"] = version
    return document


def allow(action: object = "*", resource: object = "*", condition: dict | None = None) -> dict:
    return _policy(_statement("Allow", action, resource, condition))


def deny(action: object = "*", resource: object = "*", condition: dict | None = None) -> dict:
    return _policy(_statement("Deny", action, resource, condition))


def request(action: str = "s3:GetObject", resource: str = OBJECT, **context) -> Request:
    return Request(action, resource, context)


def ask(context: dict, action: str = "s3:GetObject", resource: str = OBJECT) -> Request:
    return Request(action, resource, context)


def holds(condition: dict, context: dict) -> bool:
    """Whether a statement allowing everything under `condition` allows a request with
    `context`."""
    return allowed([allow(condition=condition)], ask(context))


# --- Policy evaluation logic -----------------------------------------------------------------


def test_an_explicit_deny_beats_an_allow():
    """Policy evaluation logic: a Deny statement that applies overrides any Allow."""
    assert evaluate([allow(), deny("s3:GetObject")], request()) == "explicit-deny"
    assert evaluate([allow(), deny("s3:PutObject")], request()) == "allow"


def test_a_request_no_statement_allows_is_implicitly_denied():
    """Policy evaluation logic: a principal is denied by default; only an Allow lets it in."""
    assert evaluate([], request()) == "implicit-deny"
    assert evaluate([allow("s3:PutObject")], request()) == "implicit-deny"
    assert not allowed([allow("s3:PutObject")], request())


def test_inline_and_managed_documents_are_evaluated_together():
    """Policy evaluation logic: all the principal's identity-based policies apply at once; a
    Deny in one beats an Allow in another, and an Allow in any one suffices."""
    inline, managed = allow("s3:GetObject"), deny("s3:*", f"{BUCKET}/jobs/*")
    assert evaluate([inline, managed], request()) == "explicit-deny"
    assert evaluate([allow("ec2:*"), inline], request()) == "allow"


def test_a_request_both_the_identity_and_the_boundary_allow_is_allowed():
    """Permissions boundaries for IAM entities: the effective permissions are what both the
    identity-based policies and the boundary allow."""
    assert evaluate([allow("s3:GetObject")], request(), boundary=allow("s3:*")) == "allow"


def test_what_the_identity_allows_outside_the_boundary_is_implicitly_denied():
    """Permissions boundaries for IAM entities: a boundary sets the maximum permissions; what
    it does not allow is denied, whatever the identity-based policies allow."""
    decision = evaluate([allow("s3:GetObject")], request(), boundary=allow("ec2:*"))
    assert decision == "implicit-deny"


def test_a_boundary_grants_nothing_on_its_own():
    """Permissions boundaries for IAM entities: a boundary "does not provide permissions on
    its own"; what only the boundary allows is implicitly denied."""
    decision = evaluate([allow("ec2:*")], request(), boundary=allow("s3:GetObject"))
    assert decision == "implicit-deny"
    assert evaluate([], request(), boundary=allow()) == "implicit-deny"


def test_a_deny_in_the_boundary_is_an_explicit_deny():
    """Permissions boundaries for IAM entities: an explicit deny in either the identity-based
    policies or the boundary overrides the allow."""
    boundary = _policy(_statement("Allow"), _statement("Deny", "s3:Get*"))
    assert evaluate([allow()], request(), boundary=boundary) == "explicit-deny"
    assert evaluate([], request(), boundary=boundary) == "explicit-deny"


# --- Action, Resource and their Not forms ----------------------------------------------------


def test_not_action_covers_every_action_but_those_listed():
    """IAM JSON policy elements: NotAction: the statement applies to every action except
    those listed."""
    policy = _policy({"Effect": "Allow", "NotAction": ["iam:*", "s3:Delete*"], "Resource": "*"})
    assert allowed([policy], request("s3:GetObject"))
    assert not allowed([policy], request("s3:DeleteObject"))
    assert not allowed([policy], request("iam:CreateUser"))


def test_not_resource_covers_every_resource_but_those_listed():
    """IAM JSON policy elements: NotResource: the statement applies to every resource except
    those listed (a Deny with NotResource denies everything else)."""
    policy = _policy(_statement("Allow"),
                     {"Effect": "Deny", "Action": "s3:*", "NotResource": f"{BUCKET}/jobs/*"})
    assert evaluate([policy], request()) == "allow"
    assert evaluate([policy], request(resource=f"{BUCKET}/other")) == "explicit-deny"


def test_a_star_matches_any_run_of_characters_slashes_and_colons_included():
    """IAM JSON policy elements: Resource: `*` matches any combination of characters, across
    `/` and (at a segment's end) `:`; `"Resource": "*"` matches every resource."""
    assert allowed([allow("s3:*", f"{BUCKET}/jobs/*")], request())
    assert allowed([allow("s3:*", "arn:aws:s3:::cloudtrain-*/jobs/*/final.json")], request())
    assert allowed([allow("*", "*")], request("ec2:RunInstances", "arn:aws:ec2:x:1:i/a"))
    assert not allowed([allow("s3:*", f"{BUCKET}/jobs/*/bundle/*")], request())


def test_a_question_mark_matches_exactly_one_character():
    """IAM JSON policy elements: Resource and Action: `?` matches any single character."""
    assert allowed([allow("s3:?etObject", f"{BUCKET}/jobs/*/job-?/*")], request())
    assert not allowed([allow("s3:*", f"{BUCKET}/jobs/*/job-??/*")], request())
    assert not allowed([allow("s3:?GetObject")], request())


def test_actions_match_whatever_their_case_and_resources_only_in_theirs():
    """IAM JSON policy elements: Action values are case-insensitive; ARNs (and so Resource
    patterns) are case-sensitive."""
    assert allowed([allow("S3:getobject")], request("s3:GetObject"))
    assert allowed([allow("s3:Get*")], request("S3:GETOBJECT"))
    assert not allowed([allow("s3:*", OBJECT.upper())], request())


def test_action_and_resource_may_be_a_string_or_a_list():
    """IAM JSON policy elements: Action and Resource take one value or a list (any matches)."""
    policy = allow(["ec2:*", "s3:GetObject"], ["arn:aws:s3:::other/*", f"{BUCKET}/*"])
    assert allowed([policy], request())
    assert not allowed([policy], request("s3:PutObject"))


# --- Policy variables --------------------------------------------------------------------------


def test_a_resource_with_aws_userid_matches_the_callers_own_prefix_only():
    """IAM policy elements: Variables and tags: ${aws:userid} in a Resource is replaced by the
    caller's value from the request context."""
    policy = allow("s3:*", f"{BUCKET}/jobs/${{aws:userid}}/*")
    assert allowed([policy], request(**{"aws:userid": USERID}))
    assert not allowed([policy], request(**{"aws:userid": "AROAOTHER:i-0def"}))


def test_a_principal_tag_variable_is_resolved_by_a_case_insensitive_key_name():
    """IAM policy elements: Variables and tags: tags are variables too, and key names are
    case-insensitive (${aws:PrincipalTag/job} is aws:principaltag/job)."""
    policy = allow("s3:GetObject", f"{BUCKET}/jobs/*/${{aws:PrincipalTag/job}}/*")
    assert allowed([policy], request(**{"AWS:principaltag/JOB": "job-1"}))
    assert not allowed([policy], request(**{"aws:PrincipalTag/job": "job-2"}))


def test_a_resource_whose_variable_has_no_value_matches_nothing():
    """IAM policy elements: Variables and tags (Policy variables with no value): a Resource
    holding a variable the request has no value for matches no resource, in an Allow or a
    Deny alike."""
    resource = f"{BUCKET}/jobs/${{aws:userid}}/*"
    assert not allowed([allow("s3:*", resource)], request())
    assert not allowed([allow("s3:*", f"{BUCKET}/*${{aws:userid}}*")], request())
    assert evaluate([allow(), deny("s3:*", resource)], request()) == "allow"


def test_a_variables_default_stands_in_only_for_an_absent_key():
    """IAM policy elements: Variables and tags (Specifying default values): ${key, 'default'}
    takes the default when the key is absent, the key's value when present."""
    policy = allow("s3:*", f"{BUCKET}/jobs/${{aws:userid, 'anonymous'}}/*")
    assert allowed([policy], request(resource=f"{BUCKET}/jobs/anonymous/x"))
    assert not allowed([policy], request(resource=f"{BUCKET}/jobs/anonymous/x",
                                         **{"aws:userid": USERID}))
    assert allowed([policy], request(**{"aws:userid": USERID}))


@pytest.mark.parametrize("version", [None, "2008-10-17"])
def test_variables_are_literal_text_before_version_2012_10_17(version):
    """IAM policy elements: Variables and tags: without "Version": "2012-10-17", ${...} is
    literal text in the policy."""
    resource = f"{BUCKET}/jobs/${{aws:userid}}/*"
    policy = _policy(_statement("Allow", "s3:*", resource), version=version)
    assert not allowed([policy], request(**{"aws:userid": USERID}))
    literal = request(resource=f"{BUCKET}/jobs/${{aws:userid}}/x", **{"aws:userid": USERID})
    assert allowed([policy], literal)


def test_special_variables_stand_for_literal_star_question_mark_and_dollar():
    """IAM policy elements: Variables and tags (Special characters): ${*}, ${?} and ${$} are
    the characters themselves, never wildcards."""
    policy = allow("s3:*", f"{BUCKET}/a${{*}}b${{?}}c${{$}}")
    assert allowed([policy], request(resource=f"{BUCKET}/a*b?c$"))
    assert not allowed([policy], request(resource=f"{BUCKET}/aXbYc$"))


def test_a_condition_value_variable_with_no_value_matches_nothing():
    """IAM policy elements: Variables and tags (Policy variables with no value): StringEquals
    does not match a variable without a value, and the negated StringNotEquals does."""
    equals = {"StringEquals": {"aws:ResourceAccount": "${aws:PrincipalAccount}"}}
    not_equals = {"StringNotEquals": {"aws:ResourceAccount": "${aws:PrincipalAccount}"}}
    same = {"aws:ResourceAccount": "123", "aws:PrincipalAccount": "123"}
    assert holds(equals, same) and not holds(not_equals, same)
    assert not holds(equals, {"aws:ResourceAccount": "123"})
    assert holds(not_equals, {"aws:ResourceAccount": "123"})


def test_a_multivalued_key_cannot_be_a_policy_variable():
    """Single-valued vs. multivalued context keys: multivalued keys cannot be used as policy
    variables."""
    policy = allow("s3:*", f"{BUCKET}/${{aws:TagKeys}}")
    with pytest.raises(PolicyError, match="multivalued"):
        evaluate([policy], request(**{"aws:TagKeys": ["a"]}))


def test_a_variable_before_the_arns_resource_part_is_refused():
    """IAM policy elements: Variables and tags: a variable may stand only after the ARN's
    fifth colon, never for its service, region or account."""
    with pytest.raises(PolicyError, match="before the resource part"):
        evaluate([allow("iam:*", "arn:aws:iam::${aws:PrincipalAccount}:role/x")], request())


# --- Condition: the block's logic --------------------------------------------------------------


def test_operators_and_keys_are_anded_and_a_keys_values_ored():
    """Conditions with multiple context keys or values: operators AND, keys under one
    operator AND, the values listed for one key OR."""
    condition = {"StringEquals": {"aws:PrincipalTag/team": ["ml", "infra"],
                                  "aws:PrincipalAccount": "123"},
                 "StringLike": {"s3:prefix": "jobs/*"}}
    base = {"aws:PrincipalTag/team": "infra", "aws:PrincipalAccount": "123", "s3:prefix": "jobs/"}
    assert holds(condition, base)
    assert not holds(condition, base | {"aws:PrincipalTag/team": "web"})
    assert not holds(condition, base | {"aws:PrincipalAccount": "999"})
    assert not holds(condition, base | {"s3:prefix": "other/"})


def test_numeric_equals_on_two_keys_fails_when_the_request_sets_only_one():
    """IAM JSON policy elements: Condition operators: a key absent from the request context
    does not match, so every key under NumericEquals must be present (emptying an Auto Scaling
    group: UpdateAutoScalingGroup with MinSize alone is denied)."""
    condition = {"NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}}
    assert holds(condition, {"autoscaling:MinSize": 0, "autoscaling:MaxSize": "0"})
    assert not holds(condition, {"autoscaling:MinSize": "0"})
    assert not holds(condition, {"autoscaling:MinSize": 0, "autoscaling:MaxSize": 2})


def test_condition_key_names_are_case_insensitive_on_both_sides():
    """IAM JSON policy elements: Condition: "Context key names are not case-sensitive"."""
    assert holds({"StringEquals": {"AWS:PRINCIPALACCOUNT": "123"}},
                 {"aws:principalaccount": "123"})


# --- Condition operators -----------------------------------------------------------------------


@pytest.mark.parametrize("operator, policy, value, expected", [
    ("StringEquals", "Job-1", "Job-1", True),
    ("StringEquals", "Job-1", "job-1", False),
    ("StringEquals", "job-*", "job-1", False),
    ("StringNotEquals", "Job-1", "job-1", True),
    ("StringNotEquals", "Job-1", "Job-1", False),
    ("StringEqualsIgnoreCase", "Job-1", "jOB-1", True),
    ("StringNotEqualsIgnoreCase", "Job-1", "jOB-1", False),
    ("StringLike", "jobs/*/attempts/?", "jobs/o/j/attempts/3", True),
    ("StringLike", "jobs/*", "Jobs/x", False),
    ("StringNotLike", "jobs/*", "other/x", True),
    ("StringNotLike", "jobs/*", "jobs/x", False),
])
def test_string_operators(operator, policy, value, expected):
    """IAM JSON policy elements: Condition operators (String): Equals is exact and
    case-sensitive, IgnoreCase ignores case, Like takes `*` and `?`, the Not forms negate."""
    assert holds({operator: {"aws:PrincipalTag/job": policy}},
                 {"aws:PrincipalTag/job": value}) is expected


def test_condition_values_of_other_json_types_compare_as_strings():
    """IAM JSON policy elements: Condition: a string operator compares the policy's number or
    boolean as its text ("5", "true")."""
    assert holds({"StringEquals": {"ec2:Count": 5}}, {"ec2:Count": "5"})
    assert holds({"StringEquals": {"aws:MultiFactorAuthPresent": True}},
                 {"aws:MultiFactorAuthPresent": True})


@pytest.mark.parametrize("operator, policy, value, expected", [
    ("NumericEquals", "10", 10, True),
    ("NumericEquals", "10", "10.0", True),
    ("NumericNotEquals", "10", 11, True),
    ("NumericNotEquals", ["10", "11"], 11, False),
    ("NumericLessThan", "10", 9, True),
    ("NumericLessThan", "10", 10, False),
    ("NumericLessThanEquals", "10", 10, True),
    ("NumericGreaterThan", "10", 10, False),
    ("NumericGreaterThanEquals", "10", 10, True),
    ("NumericGreaterThanEquals", 1.5, "2", True),
])
def test_numeric_operators(operator, policy, value, expected):
    """IAM JSON policy elements: Condition operators (Numeric): integers and decimals
    compared as numbers."""
    assert holds({operator: {"s3:max-keys": policy}}, {"s3:max-keys": value}) is expected


@pytest.mark.parametrize("operator, policy, value, expected", [
    ("DateEquals", "2024-01-01T00:00:00Z", "1704067200", True),
    ("DateEquals", "2024-01-01", "2024-01-01T00:00:00+00:00", True),
    ("DateNotEquals", "2024-01-01T00:00:00Z", "2024-01-01T01:00:00+01:00", False),
    ("DateLessThan", "2024-01-01T00:00:00Z", "2023-12-31T23:59:59Z", True),
    ("DateLessThan", "2024-01-01T00:00:00Z", 1704067200, False),
    ("DateLessThanEquals", "1704067200", "2024-01-01T00:00:00Z", True),
    ("DateGreaterThan", "2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z", True),
    ("DateGreaterThanEquals", "2024-01-01T00:00:00Z", "2023-06-01T00:00:00Z", False),
])
def test_date_operators(operator, policy, value, expected):
    """IAM JSON policy elements: Condition operators (Date): W3C ISO 8601 dates or epoch
    seconds, compared as instants."""
    assert holds({operator: {"aws:CurrentTime": policy}}, {"aws:CurrentTime": value}) is expected


def test_bool_matches_true_or_false_in_any_spelling_of_the_context():
    """IAM JSON policy elements: Condition operators (Boolean): Bool compares a key with true
    or false."""
    deny_http = deny("s3:*", condition={"Bool": {"aws:SecureTransport": "false"}})
    assert evaluate([allow(), deny_http], request(**{"aws:SecureTransport": False})) \
        == "explicit-deny"
    assert evaluate([allow(), deny_http], request(**{"aws:SecureTransport": "true"})) == "allow"
    assert holds({"Bool": {"aws:SecureTransport": True}}, {"aws:SecureTransport": "True"})


def test_ip_address_operators_take_cidr_ranges_and_single_addresses():
    """IAM JSON policy elements: Condition operators (IP address): CIDR ranges, an address
    without a prefix being /32; NotIpAddress is every other address."""
    condition = {"IpAddress": {"aws:SourceIp": ["203.0.113.0/24", "198.51.100.7",
                                                "2001:DB8:1234:5678::/64"]}}
    assert holds(condition, {"aws:SourceIp": "203.0.113.200"})
    assert holds(condition, {"aws:SourceIp": "198.51.100.7"})
    assert not holds(condition, {"aws:SourceIp": "198.51.100.8"})
    assert holds(condition, {"aws:SourceIp": "2001:db8:1234:5678::1"})
    outside = {"NotIpAddress": {"aws:SourceIp": "203.0.113.0/24"}}
    assert holds(outside, {"aws:SourceIp": "192.0.2.1"})
    assert not holds(outside, {"aws:SourceIp": "203.0.113.9"})


def test_arn_operators_compare_the_six_parts_one_by_one():
    """IAM JSON policy elements: Condition operators (ARN): ArnLike matches each of the six
    colon-separated parts on its own (the page's own example matches StringLike, not
    ArnLike); ArnEquals behaves as ArnLike; the Not forms negate."""
    pattern = "arn:aws:someservice:*:111122223333:finance/*"
    value = {"aws:SourceArn": "arn:aws:someservice:us-east-2:999999999999:store/abc:"
                              "111122223333:finance/document.txt"}
    assert holds({"StringLike": {"aws:SourceArn": pattern}}, value)
    assert not holds({"ArnLike": {"aws:SourceArn": pattern}}, value)
    assert holds({"ArnNotLike": {"aws:SourceArn": pattern}}, value)
    role = {"aws:PrincipalArn": "arn:aws:iam::123:role/cloudtrain-job"}
    assert holds({"ArnEquals": {"aws:PrincipalArn": "arn:aws:iam::*:role/cloudtrain-*"}}, role)
    assert not holds({"ArnNotEquals": {"aws:PrincipalArn": "arn:aws:iam::123:role/*"}}, role)
    assert not holds({"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::123:role/*"}},
                     {"aws:PrincipalArn": "not-an-arn"})


def test_a_negated_operator_with_several_values_is_true_only_if_none_matches():
    """Conditions with multiple context keys or values: the values of a negated operator are
    NOR'ed: the key must match none of them."""
    condition = {"StringNotEquals": {"aws:RequestedRegion": ["us-east-1", "eu-west-1"]}}
    assert holds(condition, {"aws:RequestedRegion": "ap-south-1"})
    assert not holds(condition, {"aws:RequestedRegion": "eu-west-1"})


POSITIVE = ["StringEquals", "StringEqualsIgnoreCase", "StringLike", "NumericEquals",
            "NumericLessThanEquals", "DateEquals", "DateGreaterThanEquals", "Bool", "IpAddress",
            "ArnEquals", "ArnLike"]
NEGATED = ["StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "NumericNotEquals",
           "DateNotEquals", "NotIpAddress", "ArnNotEquals", "ArnNotLike"]
# A policy value for each operator family, and a context value of the same kind.
VALUES = {"String": ("x", "x"), "Numeric": ("1", "1"), "Date": ("2024-01-01", "1704067200"),
          "Bool": ("true", "true"), "IpAddress": ("10.0.0.0/8", "10.0.0.1"),
          "NotIpAddress": ("10.0.0.0/8", "10.0.0.1"), "Arn": ("arn:aws:s3:::b", "arn:aws:s3:::b")}


def _values(operator: str) -> tuple[str, str]:
    return next(pair for family, pair in VALUES.items() if operator.startswith(family))


@pytest.mark.parametrize("operator", POSITIVE)
def test_a_missing_key_fails_a_positive_operator(operator):
    """IAM JSON policy elements: Condition operators: "If the key that you specify in a policy
    condition is not present in the request context, the values do not match and the
    condition is false"."""
    assert not holds({operator: {"aws:SomeKey": _values(operator)[0]}}, {})


@pytest.mark.parametrize("operator", NEGATED)
def test_a_missing_key_satisfies_a_negated_operator(operator):
    """IAM JSON policy elements: Condition operators: "If the policy condition requires that
    the key is not matched, such as StringNotLike or ArnNotLike, and the right key is not
    present, the condition is true"."""
    assert holds({operator: {"aws:SomeKey": _values(operator)[0]}}, {})


@pytest.mark.parametrize("operator", POSITIVE + NEGATED)
def test_if_exists_makes_a_missing_key_true_and_checks_a_present_one(operator):
    """IAM JSON policy elements: Condition operators (...IfExists): "If the key is not present,
    evaluate the condition element as true"; a present key is checked as without IfExists."""
    policy, present = _values(operator)
    assert holds({f"{operator}IfExists": {"aws:SomeKey": policy}}, {})
    plain = holds({operator: {"aws:SomeKey": policy}}, {"aws:SomeKey": present})
    assert plain is (operator in POSITIVE)
    assert holds({f"{operator}IfExists": {"aws:SomeKey": policy}}, {"aws:SomeKey": present}) \
        is plain


def test_if_exists_lets_other_resources_through_but_checks_the_instance_type():
    """IAM JSON policy elements: Condition operators (...IfExists): the page's RunInstances
    example: StringLikeIfExists on ec2:InstanceType."""
    condition = {"StringLikeIfExists": {"ec2:InstanceType": ["g5.*", "g6.*"]}}
    assert holds(condition, {})
    assert holds(condition, {"ec2:InstanceType": "g5.xlarge"})
    assert not holds(condition, {"ec2:InstanceType": "p5.48xlarge"})


def test_null_tests_whether_the_key_is_absent():
    """IAM JSON policy elements: Condition operators (Null): "true" holds when the key is
    absent, "false" when it is present (whatever its value)."""
    tagged = {"Null": {"aws:ResourceTag/cloudtrain:owner": "false"}}
    assert holds(tagged, {"aws:ResourceTag/cloudtrain:owner": ""})
    assert not holds(tagged, {})
    assert not holds(tagged, {"aws:ResourceTag/cloudtrain:owner": None})
    assert holds({"Null": {"aws:TokenIssueTime": True}}, {})
    assert not holds({"Null": {"aws:TokenIssueTime": "true"}}, {"aws:TokenIssueTime": "x"})


def test_for_all_values_needs_every_request_value_to_match_and_holds_for_none():
    """Single-valued vs. multivalued context keys: ForAllValues is true when every value in the
    request matches one in the policy, and also when the key is absent or empty."""
    condition = {"ForAllValues:StringEquals": {"aws:TagKeys": ["cloudtrain:owner", "Name"]}}
    assert holds(condition, {"aws:TagKeys": ["Name", "cloudtrain:owner"]})
    assert not holds(condition, {"aws:TagKeys": ["Name", "cost-center"]})
    assert holds(condition, {})
    assert holds(condition, {"aws:TagKeys": []})
    assert holds(condition, {"aws:TagKeys": ""})


def test_for_any_value_needs_one_request_value_to_match_and_fails_for_none():
    """Single-valued vs. multivalued context keys: ForAnyValue is true when any value in the
    request matches one in the policy, and false when the key is absent or empty."""
    condition = {"ForAnyValue:StringLike": {"aws:TagKeys": "cloudtrain:*"}}
    assert holds(condition, {"aws:TagKeys": ["Name", "cloudtrain:job"]})
    assert not holds(condition, {"aws:TagKeys": ["Name"]})
    assert not holds(condition, {})
    assert not holds(condition, {"aws:TagKeys": []})


def test_set_operators_apply_a_negated_operator_to_each_request_value():
    """Single-valued vs. multivalued context keys: a set operator applies its operator to each
    value of the key: ForAllValues:StringNotEquals holds when no value is listed,
    ForAnyValue:StringNotEquals when some value is not."""
    listed = ["cloudtrain:owner", "cloudtrain:job"]
    none_listed = {"ForAllValues:StringNotEquals": {"aws:TagKeys": listed}}
    one_unlisted = {"ForAnyValue:StringNotEquals": {"aws:TagKeys": listed}}
    assert holds(none_listed, {"aws:TagKeys": ["Name"]})
    assert not holds(none_listed, {"aws:TagKeys": ["Name", "cloudtrain:job"]})
    assert holds(one_unlisted, {"aws:TagKeys": ["Name", "cloudtrain:job"]})
    assert not holds(one_unlisted, {"aws:TagKeys": ["cloudtrain:job"]})


def test_a_set_operator_reads_a_single_valued_key_as_a_set_of_one():
    """Single-valued vs. multivalued context keys: set operators on a single-valued key are
    evaluated (and advised against: ForAllValues then holds for an absent key)."""
    condition = {"ForAllValues:StringEquals": {"aws:PrincipalTag/team": "ml"}}
    assert holds(condition, {"aws:PrincipalTag/team": "ml"})
    assert not holds(condition, {"aws:PrincipalTag/team": "web"})
    assert holds(condition, {})


def test_a_plain_operator_on_a_multivalued_key_is_refused():
    """Single-valued vs. multivalued context keys: "Multivalued context keys require a
    condition set operator"; the docs do not say how a plain one reads several values."""
    with pytest.raises(PolicyError, match="ForAllValues or ForAnyValue"):
        holds({"StringEquals": {"aws:TagKeys": "Name"}}, {"aws:TagKeys": ["Name"]})


# --- PolicyError -------------------------------------------------------------------------------


@pytest.mark.parametrize("document", [
    allow(condition={"StringEqualz": {"k": "v"}}),
    allow(condition={"ForEveryValue:StringEquals": {"k": "v"}}),
    allow(condition={"NullIfExists": {"k": "true"}}),
    allow(condition={"ForAnyValue:Null": {"k": "true"}}),
    allow(condition={"ForAnyValue:StringEqualsIfExists": {"k": "v"}}),
    allow(condition={"StringEquals": {}}),
    allow(condition={"StringEquals": {"k": []}}),
    allow(condition={"StringEquals": {"k": {"nested": "map"}}}),
    allow(condition={"NumericEquals": {"k": "ten"}}),
    allow(condition={"NumericEquals": {"k": "${aws:x}"}}),
    allow(condition={"NumericEquals": {"k": True}}),
    allow(condition={"DateLessThan": {"k": "yesterday"}}),
    allow(condition={"DateLessThan": {"k": "2024-01-01T00:00:00"}}),
    allow(condition={"Bool": {"k": "yes"}}),
    allow(condition={"Null": {"k": "maybe"}}),
    allow(condition={"IpAddress": {"k": "10.0.0.300/8"}}),
    allow(condition={"StringEquals": {"k": "${aws:userid"}}),
    allow(condition={"StringEquals": {"k": "${aws:userid, anonymous}"}}),
    allow(resource="arn:aws:s3:::b/${}"),
    _policy({"Effect": "allow", "Action": "*", "Resource": "*"}),
    _policy({"Effect": "Allow", "Action": "*", "NotAction": "s3:*", "Resource": "*"}),
    _policy({"Effect": "Allow", "Resource": "*"}),
    _policy({"Effect": "Allow", "Action": "*", "Resource": "*", "NotResource": "x"}),
    _policy({"Effect": "Allow", "Action": "*"}),
    _policy({"Effect": "Allow", "Action": [], "Resource": "*"}),
    _policy({"Effect": "Allow", "Action": "*", "Resource": "*", "Principal": "*"}),
    _policy(_statement("Allow"), version="2012-10-18"),
    {"Version": "2012-10-17"},
    {"Version": "2012-10-17", "Statement": [], "Extra": 1},
])
def test_a_document_the_evaluator_cannot_read_as_aws_would_raises(document):
    """An unknown operator, element or value, or a case the docs leave open, is a PolicyError,
    never a silent allow or deny, whatever the request."""
    with pytest.raises(PolicyError):
        evaluate([document], request())


@pytest.mark.parametrize("operator, value", [
    ("NumericEquals", "many"), ("DateEquals", "soon"), ("Bool", "maybe"),
    ("IpAddress", "localhost"), ("StringEquals", 1.5j),
])
def test_a_context_value_an_operator_cannot_read_raises(operator, value):
    """A request context value an operator cannot compare is a PolicyError, not a mismatch."""
    policy_value = {"NumericEquals": "1", "DateEquals": "2024-01-01", "Bool": "true",
                    "IpAddress": "10.0.0.0/8", "StringEquals": "x"}[operator]
    with pytest.raises(PolicyError):
        holds({operator: {"k": policy_value}}, {"k": value})


def test_an_arn_operator_value_that_is_not_an_arn_raises():
    """IAM JSON policy elements: Condition operators (ARN): a policy value without the six
    parts of an ARN cannot be compared part by part."""
    with pytest.raises(PolicyError, match="not an ARN"):
        holds({"ArnLike": {"aws:SourceArn": "*"}}, {"aws:SourceArn": "arn:aws:s3:::b"})


def test_a_bad_document_raises_even_where_another_decides_the_request():
    """Every document is checked before any is evaluated: a bad one is never hidden behind a
    deny or an allow."""
    bad = allow(condition={"StringEqualz": {"k": "v"}})
    with pytest.raises(PolicyError):
        evaluate([deny(), bad], request())
    with pytest.raises(PolicyError):
        evaluate([allow()], request(), boundary=bad)


def test_identity_is_a_list_of_documents_and_context_keys_are_unique():
    """evaluate takes the principal's documents as a list; a context naming one key twice (in
    two cases) is ambiguous, as key names ignore case."""
    with pytest.raises(PolicyError, match="list of policy documents"):
        evaluate(allow(), request())  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="twice"):
        evaluate([allow()], request(**{"aws:userid": "a", "AWS:UserId": "b"}))


# --- Properties --------------------------------------------------------------------------------

ACTIONS = ["*", "s3:*", "s3:GetObject", "s3:Get*", "s3:?etObject", "ec2:*", "iam:PassRole"]
RESOURCES = ["*", f"{BUCKET}/*", f"{BUCKET}/jobs/${{aws:userid}}/*", "arn:aws:s3:::other/*",
             "arn:aws:ec2:*:*:instance/*"]
CONDITIONS = [
    None,
    {"StringEquals": {"aws:PrincipalAccount": "123"}},
    {"StringNotEquals": {"aws:PrincipalTag/job": "job-1"}},
    {"NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}},
    {"Null": {"aws:ResourceTag/cloudtrain:owner": "false"}},
    {"ForAnyValue:StringLike": {"aws:TagKeys": "cloudtrain:*"}},
    {"ForAllValues:StringEquals": {"aws:TagKeys": ["Name"]}},
    {"StringLikeIfExists": {"ec2:InstanceType": "g5.*"}},
]
statements = st.builds(
    _statement, st.sampled_from(["Allow", "Deny"]), st.sampled_from(ACTIONS),
    st.sampled_from(RESOURCES), st.sampled_from(CONDITIONS))
documents = st.lists(statements, min_size=1, max_size=4).map(lambda s: _policy(*s))
contexts = st.fixed_dictionaries({}, optional={
    "aws:PrincipalAccount": st.sampled_from(["123", "999"]),
    "aws:userid": st.sampled_from([USERID, "AROAOTHER:i-1"]),
    "aws:PrincipalTag/job": st.sampled_from(["job-1", "job-2"]),
    "autoscaling:MinSize": st.sampled_from([0, 1]),
    "autoscaling:MaxSize": st.sampled_from([0, 1]),
    "aws:ResourceTag/cloudtrain:owner": st.just("arn:aws:iam::123:role/x"),
    "aws:TagKeys": st.lists(st.sampled_from(["Name", "cloudtrain:job"]), max_size=2),
    "ec2:InstanceType": st.sampled_from(["g5.xlarge", "p5.48xlarge"]),
})
requests = st.builds(
    Request, st.sampled_from(["s3:GetObject", "S3:getobject", "s3:PutObject", "ec2:RunInstances"]),
    st.sampled_from([OBJECT, f"{BUCKET}/jobs/{USERID}/x", "arn:aws:s3:::other/y"]), contexts)


@settings(max_examples=300, deadline=None)
@given(st.lists(documents, max_size=3), requests, statements)
def test_adding_a_deny_statement_never_turns_a_deny_into_an_allow(identity, req, extra):
    """Policy evaluation logic: a Deny can only take permissions away, and an explicit deny
    stays one whatever is added."""
    before = evaluate(identity, req)
    after = evaluate(identity + [_policy({**extra, "Effect": "Deny"})], req)
    assert after == before or after == "explicit-deny"


@settings(max_examples=300, deadline=None)
@given(st.lists(documents, max_size=3), requests, documents)
def test_adding_a_boundary_never_turns_a_deny_into_an_allow(identity, req, boundary):
    """Permissions boundaries for IAM entities: a boundary only limits what the identity-based
    policies allow."""
    before = evaluate(identity, req)
    after = evaluate(identity, req, boundary=boundary)
    assert before == "allow" or after != "allow"
    assert before != "explicit-deny" or after == "explicit-deny"


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1), st.text(), st.dictionaries(st.text(min_size=1), st.text()))
def test_everything_on_everything_allows_every_request(action, resource, context):
    """Action "*" on Resource "*" allows any action on any resource, whatever the context, when
    no boundary limits it."""
    folded = {key.lower(): value for key, value in context.items()}
    assert evaluate([allow("*", "*")], Request(action, resource, folded)) == "allow"


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ACTIONS), requests)
def test_action_and_not_action_split_every_request_between_them(pattern, req):
    """IAM JSON policy elements: NotAction: an Allow with NotAction covers exactly the actions
    the same Allow with Action does not."""
    with_action = allowed([allow(pattern)], req)
    with_not_action = allowed([_policy({"Effect": "Allow", "NotAction": pattern,
                                        "Resource": "*"})], req)
    assert with_action != with_not_action


@settings(max_examples=200, deadline=None)
@given(st.lists(documents, max_size=3), requests, st.booleans())
def test_the_case_of_the_action_never_changes_the_decision(identity, req, upper):
    """IAM JSON policy elements: Action: action names are case-insensitive."""
    recased = req.action.upper() if upper else req.action.lower()
    assert evaluate(identity, Request(recased, req.resource, req.context)) \
        == evaluate(identity, req)
