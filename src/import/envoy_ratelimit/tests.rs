//! The conversion's tests: envoyproxy/ratelimit's README examples and
//! the problems it refuses, converted and read back.

use super::*;

/// The two lines every limit carries, after its header (and name note).
const WHY_FIXED: &str = "# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;\n\
        # \"sliding_window\" would not let up to 2x the limit through around a window boundary.\n";

fn files(inputs: &[(&str, &str)]) -> Vec<(String, String)> {
    inputs
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect()
}

fn converted(inputs: &[(&str, &str)]) -> String {
    match convert_texts(&files(inputs)) {
        Ok(text) => text,
        Err(problems) => panic!("{problems:#?}"),
    }
}

/// The output with [`WHY_FIXED`] taken out of each limit, after
/// checking each limit has it and the whole parses as TOML whose rules
/// name limits it defines, none with a `key`.
fn golden(inputs: &[(&str, &str)]) -> String {
    let text = converted(inputs);
    let table: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let limits = table.get("limits").and_then(|l| l.as_table());
    for (name, limit) in limits.into_iter().flatten() {
        assert!(limit.get("key").is_none(), "{name} has a key");
        assert_eq!(limit["algorithm"].as_str(), Some("fixed_window"));
    }
    let rules = table["decision"]["descriptors"].as_array().expect("rules");
    for rule in rules {
        for limit in rule["limits"].as_array().unwrap() {
            let limit = limit.as_str().unwrap();
            assert!(limits.is_some_and(|l| l.contains_key(limit)), "{limit}");
        }
    }
    let blocks = text.matches("[limits.").count();
    assert_eq!(text.matches(WHY_FIXED).count(), blocks, "{text}");
    text.replace(WHY_FIXED, "")
}

/// Every problem, as the command line prints it.
fn problems(inputs: &[(&str, &str)]) -> Vec<String> {
    match convert_texts(&files(inputs)) {
        Ok(text) => panic!("converted:\n{text}"),
        Err(problems) => problems.iter().map(ToString::to_string).collect(),
    }
}

const MONGO: &str = "\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

#[test]
fn readme_example_1_converts_exactly() {
    let expected = r#"# envoyproxy/ratelimit domain "mongo_cps" (from config/mongo.yaml)
[limits.mongo_cps_database_users]
# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;
# "sliding_window" would not let up to 2x the limit through around a window boundary.
algorithm = "fixed_window"
limit = 500
window = "1s"

[[decision.descriptors]]
domain = "mongo_cps"
match = [{ key = "database", value = "users" }]
limits = ["mongo_cps_database_users"]

[limits.mongo_cps_database_default]
# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;
# "sliding_window" would not let up to 2x the limit through around a window boundary.
algorithm = "fixed_window"
limit = 500
window = "1s"

[[decision.descriptors]]
domain = "mongo_cps"
match = [{ key = "database", value = "default" }]
limits = ["mongo_cps_database_default"]
"#;
    assert_eq!(converted(&[("config/mongo.yaml", MONGO)]), expected);
}

#[test]
fn nested_descriptors_of_several_files_make_one_document_in_argument_order() {
    let messaging = "\
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";
    let example4 = "\
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
";
    let expected = r#"# envoyproxy/ratelimit domain "messaging" (from messaging.yaml)
[limits.messaging_message_type_marketing_to_number]
algorithm = "fixed_window"
limit = 5
window = "1d"

[[decision.descriptors]]
domain = "messaging"
match = [{ key = "message_type", value = "marketing" }, { key = "to_number" }]
limits = ["messaging_message_type_marketing_to_number"]

[limits.messaging_to_number]
algorithm = "fixed_window"
limit = 100
window = "1d"

[[decision.descriptors]]
domain = "messaging"
match = [{ key = "to_number" }]
limits = ["messaging_to_number"]

# envoyproxy/ratelimit domain "example4" (from example4.yaml)
[limits.example4_key_value_subkey]
algorithm = "fixed_window"
limit = 300
window = "1s"

[[decision.descriptors]]
domain = "example4"
match = [{ key = "key", value = "value" }, { key = "subkey" }]
limits = ["example4_key_value_subkey"]
"#;
    assert_eq!(
        golden(&[("messaging.yaml", messaging), ("example4.yaml", example4)]),
        expected
    );
}

#[test]
fn unlimited_shadow_mode_and_detailed_metric() {
    let internal = "\
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";
    let example6 = "\
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
";
    // The key-only rule comes after the exact one, though written first.
    let example8 = "\
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
";
    let expected = r#"# envoyproxy/ratelimit domain "internal" (from internal.yaml)
[[decision.descriptors]]
# unlimited: true: matches, never limits
domain = "internal"
match = [{ key = "ldap" }]
limits = []

[limits.internal_azure]
algorithm = "fixed_window"
limit = 100
window = "1m"

[[decision.descriptors]]
domain = "internal"
match = [{ key = "azure" }]
limits = ["internal_azure"]

# envoyproxy/ratelimit domain "example6" (from example6.yaml)
[limits.example6_service_user_user-a]
algorithm = "fixed_window"
limit = 10
window = "1s"
shadow = true

[[decision.descriptors]]
domain = "example6"
match = [{ key = "service" }, { key = "user", value = "user-a" }]
limits = ["example6_service_user_user-a"]

[limits.example6_service_user_user-b]
algorithm = "fixed_window"
limit = 20
window = "1s"

[[decision.descriptors]]
domain = "example6"
match = [{ key = "service" }, { key = "user", value = "user-b" }]
limits = ["example6_service_user_user-b"]

# envoyproxy/ratelimit domain "example8" (from example8.yaml)
[limits.example8_key1_value1]
algorithm = "fixed_window"
limit = 20
window = "1m"

[[decision.descriptors]]
domain = "example8"
match = [{ key = "key1", value = "value1" }]
limits = ["example8_key1_value1"]

[limits.example8_key1]
algorithm = "fixed_window"
limit = 10
window = "1m"

[[decision.descriptors]]
# detailed_metric dropped: tollgate always counts per limit
domain = "example8"
match = [{ key = "key1" }]
limits = ["example8_key1"]
"#;
    assert_eq!(
        golden(&[
            ("internal.yaml", internal),
            ("example6.yaml", example6),
            ("example8.yaml", example8)
        ]),
        expected
    );
}

#[test]
fn replaces_and_names() {
    // README example 7.
    let example7 = "\
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";
    let first = r#"domain: first
descriptors:
  - key: k
    value: "1"
    rate_limit: {name: "límite", unit: second, requests_per_unit: 1}
  - key: k
    value: "2"
    rate_limit: {name: shared, unit: second, requests_per_unit: 2}
  - key: k
    value: "3"
    rate_limit: {name: shared, unit: second, requests_per_unit: 3}
  - key: r
    rate_limit:
      unit: second
      requests_per_unit: 4
      replaces: [{name: shared}, {name: nobody}, {name: free}]
  - key: named
    rate_limit: {name: first_r, unit: minute, requests_per_unit: 5}
  - key: k
    value: a_b
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: k a
    value: b
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: free
    rate_limit: {name: free, unlimited: true}
"#;
    let second = "\
domain: second
descriptors:
  - key: k
    rate_limit: {name: shared, unit: hour, requests_per_unit: 8}
";
    let expected = r#"# envoyproxy/ratelimit domain "example7" (from example7.yaml)
[limits.specific_limit]
algorithm = "fixed_window"
limit = 5
window = "1s"

[[decision.descriptors]]
domain = "example7"
match = [{ key = "key_1", value = "value_1" }, { key = "user", value = "bkthomps" }]
limits = ["specific_limit"]

[limits.example7_key_2_value_2_user_bkthomps]
algorithm = "fixed_window"
limit = 10
window = "1s"

[[decision.descriptors]]
domain = "example7"
match = [{ key = "key_2", value = "value_2" }, { key = "user", value = "bkthomps" }]
limits = ["example7_key_2_value_2_user_bkthomps"]
replaces = ["specific_limit"]

# envoyproxy/ratelimit domain "first" (from first.yaml)
[limits.l_mite]
# "límite" in envoyproxy/ratelimit: a tollgate limit name is printable ASCII
algorithm = "fixed_window"
limit = 1
window = "1s"

[[decision.descriptors]]
domain = "first"
match = [{ key = "k", value = "1" }]
limits = ["l_mite"]

[limits.shared]
algorithm = "fixed_window"
limit = 2
window = "1s"

[[decision.descriptors]]
domain = "first"
match = [{ key = "k", value = "2" }]
limits = ["shared"]

[limits.shared_2]
# "shared" in envoyproxy/ratelimit, the name of the limit at first.yaml:6 too
algorithm = "fixed_window"
limit = 3
window = "1s"

[[decision.descriptors]]
domain = "first"
match = [{ key = "k", value = "3" }]
limits = ["shared_2"]

[limits.first_k_a_b]
algorithm = "fixed_window"
limit = 6
window = "1m"

[[decision.descriptors]]
domain = "first"
match = [{ key = "k", value = "a_b" }]
limits = ["first_k_a_b"]

[limits.first_r_2]
algorithm = "fixed_window"
limit = 4
window = "1s"

[[decision.descriptors]]
# note: replaces "nobody", which names no limited rate_limit of domain "first": it replaces nothing,
# in envoyproxy/ratelimit as here.
# note: replaces "free", which names no limited rate_limit of domain "first": it replaces nothing,
# in envoyproxy/ratelimit as here.
domain = "first"
match = [{ key = "r" }]
limits = ["first_r_2"]
replaces = ["shared", "shared_2"]

[limits.first_r]
algorithm = "fixed_window"
limit = 5
window = "1m"

[[decision.descriptors]]
domain = "first"
match = [{ key = "named" }]
limits = ["first_r"]

[limits.first_k_a_b_2]
algorithm = "fixed_window"
limit = 7
window = "1m"

[[decision.descriptors]]
domain = "first"
match = [{ key = "k a", value = "b" }]
limits = ["first_k_a_b_2"]

[[decision.descriptors]]
# unlimited: true: matches, never limits
domain = "first"
match = [{ key = "free" }]
limits = []

# envoyproxy/ratelimit domain "second" (from second.yaml)
[limits.shared_3]
# "shared" in envoyproxy/ratelimit, the name of the limit at first.yaml:6 too
algorithm = "fixed_window"
limit = 8
window = "1h"

[[decision.descriptors]]
domain = "second"
match = [{ key = "k" }]
limits = ["shared_3"]
"#;
    assert_eq!(
        golden(&[
            ("example7.yaml", example7),
            ("first.yaml", first),
            ("second.yaml", second)
        ]),
        expected
    );
}

#[test]
fn every_unit_gets_envoys_divider() {
    let units = "\
domain: units
descriptors:
  - key: s
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: m
    rate_limit: {unit: MINUTE, requests_per_unit: 2}
  - key: h
    rate_limit: {unit: Hour, requests_per_unit: 3}
  - key: d
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: w
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: mo
    rate_limit: {unit: month, requests_per_unit: 6}
  - key: y
    rate_limit: {unit: year, requests_per_unit: 4294967295}
";
    let text = golden(&[("units.yaml", units)]);
    let windows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("limit = ") || l.starts_with("window = "))
        .collect();
    assert_eq!(
        windows,
        [
            "limit = 1",
            "window = \"1s\"",
            "limit = 2",
            "window = \"1m\"",
            "limit = 3",
            "window = \"1h\"",
            "limit = 4",
            "window = \"1d\"",
            "limit = 5",
            "window = \"7d\"",
            "limit = 6",
            "window = \"30d\"",
            "limit = 4294967295",
            "window = \"365d\"",
        ]
    );
    // tollgate reads each window as envoyproxy/ratelimit's divider.
    let dividers = [1, 60, 3600, 86_400, 604_800, 2_592_000, 31_536_000];
    for (unit, seconds) in [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ]
    .into_iter()
    .zip(dividers)
    {
        let window = crate::config::units::parse_duration(unit.window()).unwrap();
        assert_eq!(window.as_secs(), seconds, "{unit:?}");
    }
}

#[test]
fn wildcards_are_prefixes_tried_in_file_order() {
    // README example 9's trailing wildcard, and two more: the shorter
    // prefix comes first in the file, so envoyproxy/ratelimit never
    // reaches the longer one, and neither does tollgate.
    let example9 = "\
domain: example9
descriptors:
  - key: key1
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: api*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: api/v1*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: any
    value: '*'
    rate_limit: {unit: minute, requests_per_unit: 5}
";
    let expected = r#"# envoyproxy/ratelimit domain "example9" (from example9.yaml)
[limits.example9_key1_value1]
algorithm = "fixed_window"
limit = 2
window = "1m"

[[decision.descriptors]]
domain = "example9"
match = [{ key = "key1", value = "value1" }]
limits = ["example9_key1_value1"]

[limits.example9_key1_value_prefix]
algorithm = "fixed_window"
limit = 20
window = "1m"

[[decision.descriptors]]
domain = "example9"
match = [{ key = "key1", value = "value*" }]
limits = ["example9_key1_value_prefix"]

[limits.example9_key1]
algorithm = "fixed_window"
limit = 1
window = "1m"

[[decision.descriptors]]
domain = "example9"
match = [{ key = "key1" }]
limits = ["example9_key1"]

[limits.example9_path_api_prefix]
algorithm = "fixed_window"
limit = 3
window = "1m"

[[decision.descriptors]]
domain = "example9"
match = [{ key = "path", value = "api*" }]
limits = ["example9_path_api_prefix"]

[limits.example9_path_api_v1_prefix]
algorithm = "fixed_window"
limit = 4
window = "1m"

[[decision.descriptors]]
# note: never applies, in envoyproxy/ratelimit as here: { key = "path", value = "api*" } (line 13)
# is tried first for every value of entry 1 this rule matches, and has a rule for each such
# descriptor.
domain = "example9"
match = [{ key = "path", value = "api/v1*" }]
limits = ["example9_path_api_v1_prefix"]

[limits.example9_any_any]
algorithm = "fixed_window"
limit = 5
window = "1m"

[[decision.descriptors]]
domain = "example9"
match = [{ key = "any", value = "*" }]
limits = ["example9_any_any"]
"#;
    assert_eq!(golden(&[("example9.yaml", example9)]), expected);
}

#[test]
fn where_greedy_matching_can_answer_otherwise_the_rule_says_so() {
    let greedy = "\
domain: g
descriptors:
  # (a=x, b=z): envoyproxy/ratelimit enters a=x, finds no b=z, no limit.
  - key: a
    value: x
    descriptors:
      - key: b
        value: y
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 2}
  # (ip=10.0.0.1) alone: the exact node has no rate_limit of its own.
  - key: ip
    value: 10.0.0.1
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 6}
  # Covered: every (c=x, d=...) ends at a rule below c=x.
  - key: c
    value: x
    descriptors:
      - key: d
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: c
    descriptors:
      - key: d
        rate_limit: {unit: second, requests_per_unit: 8}
  # Unlimited either way: no note.
  - key: e
    value: x
    descriptors:
      - key: f
        rate_limit: {unit: second, requests_per_unit: 9}
  - key: e
    rate_limit: {unlimited: true}
";
    let expected = r#"# envoyproxy/ratelimit domain "g" (from g.yaml)
[limits.g_a_x_b_y]
algorithm = "fixed_window"
limit = 1
window = "1s"

[[decision.descriptors]]
domain = "g"
match = [{ key = "a", value = "x" }, { key = "b", value = "y" }]
limits = ["g_a_x_b_y"]

[limits.g_a_b]
algorithm = "fixed_window"
limit = 2
window = "1s"

[[decision.descriptors]]
# note: where entry 1 also matches { key = "a", value = "x" } (line 4), envoyproxy/ratelimit takes
# that branch and never backtracks, so a descriptor that branch has no rule for is not limited
# there; here this rule applies to it.
domain = "g"
match = [{ key = "a" }, { key = "b" }]
limits = ["g_a_b"]

[limits.g_ip_10_0_0_1_user]
algorithm = "fixed_window"
limit = 5
window = "1h"

[[decision.descriptors]]
domain = "g"
match = [{ key = "ip", value = "10.0.0.1" }, { key = "user" }]
limits = ["g_ip_10_0_0_1_user"]

[limits.g_ip]
algorithm = "fixed_window"
limit = 6
window = "1h"

[[decision.descriptors]]
# note: where entry 1 also matches { key = "ip", value = "10.0.0.1" } (line 15),
# envoyproxy/ratelimit takes that branch and never backtracks, so a descriptor that branch has no
# rule for is not limited there; here this rule applies to it.
domain = "g"
match = [{ key = "ip" }]
limits = ["g_ip"]

[limits.g_c_x_d]
algorithm = "fixed_window"
limit = 7
window = "1s"

[[decision.descriptors]]
domain = "g"
match = [{ key = "c", value = "x" }, { key = "d" }]
limits = ["g_c_x_d"]

[limits.g_c_d]
algorithm = "fixed_window"
limit = 8
window = "1s"

[[decision.descriptors]]
domain = "g"
match = [{ key = "c" }, { key = "d" }]
limits = ["g_c_d"]

[limits.g_e_x_f]
algorithm = "fixed_window"
limit = 9
window = "1s"

[[decision.descriptors]]
domain = "g"
match = [{ key = "e", value = "x" }, { key = "f" }]
limits = ["g_e_x_f"]

[[decision.descriptors]]
# unlimited: true: matches, never limits
domain = "g"
match = [{ key = "e" }]
limits = []
"#;
    assert_eq!(golden(&[("g.yaml", greedy)]), expected);
}

#[test]
fn a_leaf_without_rate_limit_matches_and_never_limits() {
    // envoyproxy/ratelimit's test/config/basic_config.yaml: "effectively
    // whitelists the value", ahead of the key-only limit.
    let basic = "\
domain: test-domain
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  # First level override with no limit. This effectively whitelists the value.
  - key: key2
    value: value3
";
    let expected = r#"# envoyproxy/ratelimit domain "test-domain" (from basic.yaml)
[[decision.descriptors]]
# no rate_limit and no descriptors below: envoyproxy/ratelimit lets it through unlimited
domain = "test-domain"
match = [{ key = "key2", value = "value3" }]
limits = []

[limits.test-domain_key2]
algorithm = "fixed_window"
limit = 20
window = "1m"

[[decision.descriptors]]
domain = "test-domain"
match = [{ key = "key2" }]
limits = ["test-domain_key2"]
"#;
    assert_eq!(golden(&[("basic.yaml", basic)]), expected);
}

#[test]
fn yaml_reads_as_envoys_yaml_v2_reads_it() {
    // YAML 1.1 booleans and integers, scalars as text, anchors, merges.
    let yaml11 = "\
domain: yaml11
descriptors:
  - key: port
    value: 8080
    shadow_mode: yes
    rate_limit: &per_minute
      unit: minute
      requests_per_unit: 0x10
  - key: mode
    value: on
    rate_limit: *per_minute
  - key: octal
    rate_limit:
      <<: *per_minute
      requests_per_unit: 010
  - key: separated
    detailed_metric: off
    value_to_metric: true
    metadata: {team: a}
    rate_limit: {unit: second, requests_per_unit: 1_000}
";
    let expected = r#"# envoyproxy/ratelimit domain "yaml11" (from yaml11.yaml)
[limits.yaml11_port_8080]
algorithm = "fixed_window"
limit = 16
window = "1m"
shadow = true

[[decision.descriptors]]
domain = "yaml11"
match = [{ key = "port", value = "8080" }]
limits = ["yaml11_port_8080"]

[limits.yaml11_mode_on]
algorithm = "fixed_window"
limit = 16
window = "1m"

[[decision.descriptors]]
domain = "yaml11"
match = [{ key = "mode", value = "on" }]
limits = ["yaml11_mode_on"]

[limits.yaml11_octal]
algorithm = "fixed_window"
limit = 8
window = "1m"

[[decision.descriptors]]
domain = "yaml11"
match = [{ key = "octal" }]
limits = ["yaml11_octal"]

[limits.yaml11_separated]
algorithm = "fixed_window"
limit = 1000
window = "1s"

[[decision.descriptors]]
# value_to_metric dropped: tollgate counts per limit, not per value
# metadata dropped: tollgate sends no dynamic metadata
domain = "yaml11"
match = [{ key = "separated" }]
limits = ["yaml11_separated"]
"#;
    assert_eq!(golden(&[("yaml11.yaml", yaml11)]), expected);
}

#[test]
fn text_that_toml_or_its_comments_cannot_hold_as_is_is_escaped() {
    let odd = "domain: \"a \\\"b\\\"\\n\"\ndescriptors:\n  - key: \"k\\tk\"\n    value: \"v\\\\\"\n    rate_limit: {name: \"x.y\", unit: second, requests_per_unit: 1}\n";
    let expected = "# envoyproxy/ratelimit domain \"a \\\"b\\\"\\n\" (from odd.yaml)\n\
            [limits.\"x.y\"]\n\
            algorithm = \"fixed_window\"\n\
            limit = 1\n\
            window = \"1s\"\n\
            \n\
            [[decision.descriptors]]\n\
            domain = \"a \\\"b\\\"\\n\"\n\
            match = [{ key = \"k\\tk\", value = \"v\\\\\" }]\n\
            limits = [\"x.y\"]\n";
    assert_eq!(golden(&[("odd.yaml", odd)]), expected);
}

#[test]
fn unknown_fields_name_their_line_and_the_nearest_field() {
    let text = "\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limitt:
      unit: second
      requests_per_unit: 500
  - key: database
    unit: second
    rate_limit:
      unit: second
      requests_per_unit: 500
      key: nested
";
    let descriptor = "key, value, rate_limit, descriptors, shadow_mode, quota_mode, \
                          detailed_metric, value_to_metric, share_threshold, metadata";
    assert_eq!(
        problems(&[("config/mongo.yaml", text)]),
        [
            format!(
                "config/mongo.yaml:5: unknown field \"rate_limitt\" (expected one of \
                     {descriptor}); did you mean \"rate_limit\"?"
            ),
            format!(
                "config/mongo.yaml:9: unknown field \"unit\" (expected one of {descriptor}): \
                     it belongs in a `rate_limit`"
            ),
            "config/mongo.yaml:13: unknown field \"key\" (expected one of unit, \
                 requests_per_unit, unlimited, name, replaces): it belongs in a descriptor"
                .to_owned(),
        ]
    );
}

#[test]
fn wrong_types_name_their_line() {
    let text = "\
domain: types
descriptors:
  - key: a
    shadow_mode: 1
    rate_limit:
      unit: minute
      requests_per_unit: \"5\"
  - key: b
    descriptors: nope
  - key: c
    rate_limit: 5
  - key: d
    rate_limit:
      unit: [minute]
      requests_per_unit: -1
  - key: e
    rate_limit: {unit: minute, requests_per_unit: 4294967296, unlimited: 'true'}
  - just text
  - key: f
    rate_limit: {unit: minute, requests_per_unit: 1, replaces: {name: x}}
";
    assert_eq!(
        problems(&[("types.yaml", text)]),
        [
            "types.yaml:4: `shadow_mode` must be true or false, not `1`",
            "types.yaml:7: `requests_per_unit` must be a whole number from 0 to 4294967295, \
                 not the text \"5\"",
            "types.yaml:9: `descriptors` must be a list of descriptors, not `nope`",
            "types.yaml:11: `rate_limit` must be a mapping, not `5`",
            "types.yaml:14: `unit` must be text, not a list",
            "types.yaml:15: `requests_per_unit` must be a whole number from 0 to \
                 4294967295, not `-1`",
            "types.yaml:17: `unlimited` must be true or false, not the text \"true\"",
            "types.yaml:17: `requests_per_unit` must be a whole number from 0 to \
                 4294967295, not `4294967296`",
            "types.yaml:18: a descriptor must be a mapping, not `just text`",
            "types.yaml:20: `replaces` must be a list of `- name: NAME`, not a mapping",
        ]
    );
}

#[test]
fn what_tollgate_cannot_express_is_refused_at_its_line() {
    // README example 3 blocks an address with 0 requests; example 9's
    // inner wildcards; quota_mode and share_threshold.
    let text = "\
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: path
    value: /api/*/action
  - key: route
    value: api**
  - key: service
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    let found = problems(&[("edge.yaml", text)]);
    let lines: Vec<&str> = found
        .iter()
        .map(|p| p.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            "edge.yaml:13",
            "edge.yaml:15",
            "edge.yaml:17",
            "edge.yaml:20",
            "edge.yaml:24"
        ],
        "{found:#?}"
    );
    assert!(found[0].contains("requests_per_unit: 0 (deny every request)"));
    assert!(found[1].contains("value \"/api/*/action\" cannot be converted"));
    assert!(found[2].contains("value \"api**\" cannot be converted"));
    assert!(found[3].contains("quota_mode cannot be converted"));
    assert!(found[4].contains("share_threshold cannot be converted"));
}

#[test]
fn what_envoy_refuses_is_refused_at_its_line() {
    let text = "\
domain: refused
descriptors:
  - key: a
    value: b_c
  - key: a_b
    value: c
  - value: orphan
  - key: ''
  - key: u
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: v
    rate_limit: {requests_per_unit: 1}
  - key: w
    rate_limit:
      unit: second
  - key: x
    rate_limit: {unlimited: true, unit: day}
  - key: y
    rate_limit:
      name: self
      unit: second
      requests_per_unit: 1
      replaces:
        - name: self
        - name: ''
  - key: z
    descriptors:
      - key: n
      - key: n
";
    assert_eq!(
        problems(&[("refused.yaml", text)]),
        [
            "refused.yaml:5: duplicate descriptor \"a_b_c\" (key and value joined by \"_\", \
                 as envoyproxy/ratelimit names it; first at line 3): envoyproxy/ratelimit \
                 refuses it too",
            "refused.yaml:7: a descriptor needs a `key` (envoyproxy/ratelimit refuses an \
                 empty one too)",
            "refused.yaml:8: a descriptor needs a `key` (envoyproxy/ratelimit refuses an \
                 empty one too)",
            "refused.yaml:10: unit \"fortnight\" is not a unit: expected second, minute, \
                 hour, day, week, month or year",
            "refused.yaml:12: `rate_limit` needs a `unit`: second, minute, hour, day, week, \
                 month or year (or `unlimited: true`)",
            "refused.yaml:14: `rate_limit` needs `requests_per_unit` (or `unlimited: true`)",
            "refused.yaml:17: unit \"day\" with `unlimited: true`: envoyproxy/ratelimit \
                 refuses a unit there; remove it",
            "refused.yaml:24: replaces its own name \"self\": envoyproxy/ratelimit refuses it \
                 too",
            "refused.yaml:25: a `replaces` entry needs a `name` (envoyproxy/ratelimit \
                 refuses an empty one too)",
            "refused.yaml:29: duplicate descriptor \"n\" (key and value joined by \"_\", as \
                 envoyproxy/ratelimit names it; first at line 28): envoyproxy/ratelimit refuses \
                 it too",
        ]
    );
}

#[test]
fn a_domain_in_two_files_is_refused() {
    let again = "domain: mongo_cps\ndescriptors: []\n";
    assert_eq!(
        problems(&[("config/mongo.yaml", MONGO), ("other/mongo.yaml", again)]),
        [
            "other/mongo.yaml:1: domain \"mongo_cps\" is already defined at \
              config/mongo.yaml:1; envoyproxy/ratelimit refuses a domain in two files too \
              (unless MERGE_DOMAIN_CONFIG is set): merge them into one file"
        ]
    );
}

#[test]
fn every_problem_of_every_file_is_reported_at_once_in_order() {
    let broken = "domain: a\ndescriptors:\n  - key: k\n    value: [x\n";
    let empty = "# nothing yet\n";
    let no_domain = "descriptors:\n  - key: k\n    valeu: x\n";
    let duplicate_key = "domain: d\ndomain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: sec, requests_per_unit: 1}\n";
    let list = "- domain: x\n";
    let found = problems(&[
        ("broken.yaml", broken),
        ("empty.yaml", empty),
        ("no_domain.yaml", no_domain),
        ("dup.yaml", duplicate_key),
        ("list.yaml", list),
    ]);
    let lines: Vec<&str> = found
        .iter()
        .map(|p| p.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            "broken.yaml:5",
            "empty.yaml:1",
            "no_domain.yaml:1",
            "no_domain.yaml:3",
            "dup.yaml:2",
            "dup.yaml:5",
            "list.yaml:1",
        ],
        "{found:#?}"
    );
    assert!(found[0].contains("YAML syntax: "), "{found:#?}");
    assert!(found[1].contains("no domain"), "{found:#?}");
    assert!(found[2].contains("needs a `domain`"), "{found:#?}");
    assert!(found[3].contains("did you mean \"value\"?"), "{found:#?}");
    assert!(found[4].contains("duplicate key \"domain\" (first at line 1)"));
    assert!(found[5].contains("unit \"sec\" is not a unit"));
    assert!(found[6].contains("the file must be a mapping, not a list"));
}
