//! End-to-end tests of `tollgate simulate`, through the built binary: the
//! lessons it must show (the fixed window's boundary burst), decisions equal
//! to a live gateway's for the same requests, trace input (bad lines, gzip,
//! stdin), generated keys of every kind the limits read (`vary=`), the SVG
//! and the JSON. The live gateway runs in process.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use bytes::Bytes;
use common::{InProcess, TestUpstream, send, tollgate};
use http_body_util::Full;
use hyper::Request;

/// `text` as `gateway.toml` in a fresh directory; returns (dir, path).
fn config_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).expect("write config");
    let path = path.to_str().expect("utf-8 path").to_owned();
    (dir, path)
}

const WINDOW_100: &str = r#"
[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 100
window = "1m"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["per_ip"]
"#;

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// The row of `algorithm` in a `--compare --json` report.
fn row<'a>(report: &'a serde_json::Value, algorithm: &str) -> &'a serde_json::Value {
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["variant"] == algorithm)
        .unwrap_or_else(|| panic!("no row for {algorithm}: {report}"))
}

#[test]
fn boundary_burst_shows_the_fixed_window_doubling() {
    let (_dir, config) = config_file(WINDOW_100);
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--generate",
        "boundary-burst",
        "--compare",
        "fixed_window,sliding_window,sliding_log,token_bucket,leaky_bucket",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report = json(&stdout);
    assert_eq!(report["records"], 200, "100 before and 100 after the edge");
    let peak = |algorithm| row(&report, algorithm)["peak"].as_u64().unwrap();
    // Fixed window: both bursts pass, 2 × the limit within one window span.
    assert_eq!(peak("fixed_window"), 200);
    assert_eq!(row(&report, "fixed_window")["window_limit"], 100);
    assert!(
        row(&report, "fixed_window")["false_allows"]
            .as_u64()
            .unwrap()
            >= 90
    );
    // The exact log never exceeds the limit, and agrees with itself.
    assert!(peak("sliding_log") <= 100);
    assert_eq!(row(&report, "sliding_log")["false_allows"], 0);
    assert_eq!(row(&report, "sliding_log")["false_denies"], 0);
    // Sliding window: at most limit + P × e / W (src/limit/sliding_window.rs),
    // the second burst arriving within e = W / 100 of the edge with P = 100:
    // 101, and one unit of rounding.
    assert!(peak("sliding_window") <= 102, "{}", peak("sliding_window"));
    // The buckets admit their capacity plus what refills meanwhile.
    assert!(peak("token_bucket") <= 102);
    assert_eq!(row(&report, "token_bucket")["excess"], 0);
}

#[test]
fn the_table_names_every_row() {
    let (_dir, config) = config_file(WINDOW_100);
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--generate",
        "boundary-burst",
        "--route",
        "api",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.lines().next().unwrap(),
        "200 requests over 1.2s; generated: boundary-burst 100 + 100 requests 600ms \
         either side of a 1m window edge, 1 key: ip",
    );
    let header = stdout.lines().nth(2).unwrap();
    for column in [
        "route",
        "limit",
        "algorithm",
        "requests",
        "admitted",
        "denied",
        "peak",
        "false allow",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(header.ends_with("keys"), "{header}");
    let line = stdout.lines().nth(3).unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &cells[..7],
        ["api", "per_ip", "fixed_window", "200", "200", "0", "200"]
    );
    assert_eq!(cells.last(), Some(&"1"), "one key: {line}");
}

/// A gateway configuration exercising routing, trusted proxies, API-key and
/// body keys, consumers, plans and refusals, with numbers no test's real
/// time can change: token buckets refilled once an hour, an hour-long log,
/// day windows starting at the first request.
fn live_config(upstream: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[client_ip]
trusted_hops = 1

[upstreams.api]
url = "{upstream}"

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 3
refill = "1/h"

[limits.per_ip]
key = "ip"
algorithm = "sliding_log"
limit = 6
window = "1h"

[limits.login_account]
key = "body:username"
algorithm = "fixed_window"
limit = 2
window = "1d"
align = "first_request"
on_missing_key = "deny"

[limits.tenant_daily]
key = "tenant"
algorithm = "fixed_window"
limit = 2
window = "1d"
align = "first_request"
plans = {{ pro = {{ limit = 4 }} }}

[consumers."k-free"]
consumer = "free-web"
tenant = "free"
plan = "free"

[consumers."k-pro"]
consumer = "pro-web"
tenant = "pro"
plan = "pro"

[[routes]]
name = "api"
match = {{ path_prefix = "/api" }}
upstream = "api"
limits = ["per_key", "per_ip"]

[[routes]]
name = "login"
match = {{ path = "/login", methods = ["POST"] }}
upstream = "api"
limits = ["login_account", "per_ip"]

[[routes]]
name = "tenant"
match = {{ path_prefix = "/t" }}
upstream = "api"
require_consumer = true
limits = ["tenant_daily"]

[[routes]]
name = "health"
match = {{ path = "/health" }}
respond = {{ status = 200, body = "ok\n" }}
"#
    )
}

/// One request of the live trace.
struct Sent {
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Option<&'static str>,
}

fn live_requests() -> Vec<Sent> {
    let get = |path, headers: Vec<(&'static str, String)>| Sent {
        method: "GET",
        path,
        headers,
        body: None,
    };
    let mut requests = Vec::new();
    // API keys k1..k3 from two clients behind the balancer; per_key allows 3
    // each, per_ip 6 per client.
    for i in 0..14 {
        let mut headers = vec![("x-forwarded-for", format!("6.6.6.6, 198.51.100.{}", i % 2))];
        if i % 5 != 4 {
            headers.push(("x-api-key", format!("k{}", i % 3)));
        }
        requests.push(get(
            if i % 2 == 0 { "/api/a" } else { "/api/b?x=1" },
            headers,
        ));
    }
    // Logins: two per account pass; no username is a 400.
    for (user, ip) in [
        ("ann", 20),
        ("ann", 21),
        ("bob", 22),
        ("ann", 23),
        ("bob", 24),
    ] {
        requests.push(Sent {
            method: "POST",
            path: "/login",
            headers: vec![
                ("x-forwarded-for", format!("203.0.113.{ip}")),
                ("content-type", "application/json".into()),
            ],
            body: Some(if user == "ann" {
                r#"{"username":"ann"}"#
            } else {
                r#"{"username":"bob"}"#
            }),
        });
    }
    requests.push(Sent {
        method: "POST",
        path: "/login",
        headers: vec![("content-type", "application/json".into())],
        body: Some(r#"{"password":"x"}"#),
    });
    // Tenants: free gets 2 a day, pro 4; no key or an unknown key is 401.
    for key in [
        "k-free", "k-pro", "k-free", "k-pro", "k-free", "k-pro", "k-pro", "k-pro",
    ] {
        requests.push(get("/t/report", vec![("x-api-key", key.into())]));
    }
    requests.push(get("/t/report", vec![]));
    requests.push(get("/t/report", vec![("x-api-key", "k-nobody".into())]));
    requests.push(get("/health", vec![]));
    requests.push(get("/nowhere", vec![]));
    requests
}

#[tokio::test]
async fn decisions_equal_the_live_gateways() {
    let upstream = TestUpstream::start().await;
    let config = live_config(&upstream.url());
    let gateway = InProcess::start(&config).await;
    let requests = live_requests();

    // 1. Through the live gateway, one at a time.
    let mut statuses = Vec::new();
    for sent in &requests {
        let mut builder = Request::builder()
            .method(sent.method)
            .uri(sent.path)
            .header("host", "api.example");
        for (name, value) in &sent.headers {
            builder = builder.header(*name, value.as_str());
        }
        let body = Bytes::from_static(sent.body.unwrap_or("").as_bytes());
        let reply = send(gateway.addr, builder.body(Full::new(body)).unwrap()).await;
        statuses.push(reply.status);
    }
    drop(gateway);

    // 2. The same requests as a trace; the gateway saw them from 127.0.0.1.
    let dir = tempfile::tempdir().unwrap();
    let trace_path = dir.path().join("trace.jsonl");
    let mut trace = String::new();
    for (i, sent) in requests.iter().enumerate() {
        let mut headers = serde_json::Map::new();
        headers.insert("host".into(), "api.example".into());
        for (name, value) in &sent.headers {
            headers.insert((*name).into(), value.clone().into());
        }
        let mut record = serde_json::json!({
            "time": 1_772_359_200.0 + i as f64 * 0.01,
            "method": sent.method,
            "path": sent.path,
            "ip": "127.0.0.1",
            "headers": headers,
        });
        if let Some(body) = sent.body {
            record["body"] = body.into();
        }
        trace.push_str(&record.to_string());
        trace.push('\n');
    }
    std::fs::write(&trace_path, trace).unwrap();
    let config_path = dir.path().join("gateway.toml");
    std::fs::write(&config_path, &config).unwrap();
    let decisions_path = dir.path().join("decisions.jsonl");
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        config_path.to_str().unwrap(),
        "--trace",
        trace_path.to_str().unwrap(),
        "--decisions",
        decisions_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    let decisions: Vec<serde_json::Value> = std::fs::read_to_string(&decisions_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(decisions.len(), requests.len());

    // 3. Request by request: the status the gateway answered is the one the
    //    simulation says it would (admitted: the upstream's or route's 200).
    let simulated: Vec<u16> = decisions
        .iter()
        .map(|d| d["status"].as_u64().map_or(200, |s| s as u16))
        .collect();
    assert_eq!(simulated, statuses, "decisions: {decisions:#?}");
    // The trace is not trivial: every kind of answer occurs.
    for status in [200, 429, 400, 401, 404] {
        assert!(statuses.contains(&status), "no {status} in {statuses:?}");
    }
}

#[test]
fn bad_trace_lines_are_reported_and_skipped() {
    let (dir, config) = config_file(WINDOW_100);
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &trace,
        "time,method,path,ip\n\
         2026-03-01T10:00:00Z,GET,/a,192.0.2.1\n\
         tomorrow,GET,/a,192.0.2.1\n\
         2026-03-01T10:00:01Z,GET,/a,192.0.2.1\n\
         2026-03-01T10:00:02Z,GET,no-slash,192.0.2.1\n\
         2026-03-01T10:00:03Z,GET,/a,192.0.2.999\n\
         2026-03-01T10:00:04Z,GET,/a,192.0.2.1\n",
    )
    .unwrap();
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("line 3: time `tomorrow`"), "{stderr}");
    assert!(
        stderr.contains("line 5: `no-slash` is not a request path"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 6: `192.0.2.999` is not an IP address"),
        "{stderr}"
    );
    assert!(stderr.contains("skipped 3 bad records"), "{stderr}");
    let report = json(&stdout);
    assert_eq!(report["records"], 3);
    assert_eq!(report["bad_records"], 3);
    assert_eq!(report["rows"][0]["admitted"], 3);
}

/// A small trace as JSON lines: 30 requests of one client in 3 s.
fn small_trace() -> String {
    (0..30)
        .map(|i| {
            format!(
                "{{\"time\":{},\"method\":\"GET\",\"path\":\"/x\",\"ip\":\"192.0.2.7\"}}\n",
                1_772_359_200.0 + f64::from(i) * 0.1
            )
        })
        .collect()
}

#[test]
fn gzip_and_stdin_read_the_same_trace() {
    let (dir, config) = config_file(&WINDOW_100.replace("limit = 100", "limit = 10"));
    let plain = dir.path().join("trace.jsonl");
    std::fs::write(&plain, small_trace()).unwrap();
    // Compressed, under a name that does not say so: told by its bytes.
    let packed = dir.path().join("trace.log");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(small_trace().as_bytes()).unwrap();
    std::fs::write(&packed, encoder.finish().unwrap()).unwrap();

    let run = |trace: &str| {
        let (code, stdout, stderr) =
            tollgate(&["simulate", "-c", &config, "--trace", trace, "--json"]);
        assert_eq!(code, 0, "{stderr}");
        json(&stdout)
    };
    let from_file = run(plain.to_str().unwrap());
    assert_eq!(from_file["records"], 30);
    assert_eq!(from_file["rows"][0]["admitted"], 10);
    assert_eq!(from_file["rows"][0]["denied"], 20);
    assert_eq!(run(packed.to_str().unwrap())["rows"], from_file["rows"]);

    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["simulate", "-c", &config, "--trace", "-", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(small_trace().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let from_stdin = json(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(from_stdin["rows"], from_file["rows"]);
}

/// The texts and the long polylines (the series) of an SVG, in order.
fn svg_texts_and_series(text: &str) -> (Vec<String>, Vec<(String, usize)>) {
    let document = roxmltree::Document::parse(text).expect("the SVG parses as XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    let texts = document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_owned())
        .collect();
    let series = document
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter_map(|n| {
            let points = n.attribute("points")?.split_whitespace().count();
            (points > 10).then(|| (n.attribute("stroke").unwrap_or("").to_owned(), points))
        })
        .collect();
    (texts, series)
}

#[test]
fn the_svg_is_xml_with_one_series_per_algorithm() {
    let (dir, config) = config_file(WINDOW_100);
    let out = dir.path().join("chart.svg");
    let algorithms = ["fixed_window", "sliding_window", "token_bucket"];
    let (code, _, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--generate",
        "boundary-burst",
        "--compare",
        &algorithms.join(","),
        "--svg",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let (texts, lines) = svg_texts_and_series(&std::fs::read_to_string(&out).unwrap());
    // Each algorithm is in the one legend, beside both panels; the limit is
    // drawn.
    for algorithm in algorithms {
        assert_eq!(
            texts.iter().filter(|t| *t == algorithm).count(),
            1,
            "{algorithm} in {texts:?}"
        );
    }
    assert!(texts.iter().any(|t| t == "limit: 100 per 1m"), "{texts:?}");
    // One line per algorithm and panel, each its own colour.
    let colours: std::collections::HashSet<_> = lines.iter().map(|(c, _)| c).collect();
    assert_eq!(lines.len(), 2 * algorithms.len(), "{colours:?}");
    assert_eq!(colours.len(), algorithms.len());
}

/// `20 ms`, `1 s`, `10 min` in seconds.
fn label_seconds(label: &str) -> f64 {
    let (n, unit) = label.split_once(' ').expect("a number and a unit");
    let n: f64 = n.parse().expect("a number");
    n * match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        unit => panic!("unit {unit}"),
    }
}

/// The denied panel's buckets are round widths, named on its axis, 60 to
/// 120 across the run: the chart once drew 8 ms buckets of a 1.2 s run
/// (1 or 2 denials each, which read as noise) and would draw a minute's run
/// in buckets of 256 ms.
#[test]
fn the_denied_panel_counts_in_round_buckets_named_on_its_axis() {
    let (dir, config) = config_file(WINDOW_100);
    let out = dir.path().join("chart.svg");
    for (spec, expected) in [
        ("boundary-burst", "20 ms"),
        ("poisson:rate=20/s,duration=1m", "1 s"),
        ("poisson:rate=2/s,duration=2h", "2 min"),
    ] {
        let (code, stdout, stderr) = tollgate(&[
            "simulate",
            "-c",
            &config,
            "--generate",
            spec,
            "--compare",
            "sliding_log,token_bucket",
            "--svg",
            out.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let span = json(&stdout)["span_seconds"].as_f64().unwrap();
        let (texts, lines) = svg_texts_and_series(&std::fs::read_to_string(&out).unwrap());
        let label = texts
            .iter()
            .find_map(|t| t.strip_prefix("denied per "))
            .unwrap_or_else(|| panic!("{spec}: no `denied per` label in {texts:?}"));
        assert_eq!(label, expected, "{spec}");
        assert!(
            texts
                .iter()
                .any(|t| *t == format!("api: denied requests per {label}")),
            "{texts:?}"
        );
        // The denied panel's series come last: a level (two points) per bucket.
        let width = label_seconds(label);
        for (_, points) in &lines[lines.len() - 2..] {
            assert_eq!(points % 2, 0, "{spec}");
            let buckets = points / 2;
            assert!((60..=120).contains(&buckets), "{spec}: {buckets} buckets");
            assert!(buckets as f64 * width >= span, "{spec}: the run is covered");
            assert!((buckets - 1) as f64 * width <= span, "{spec}: and no more");
        }
    }
}

/// The repository's `gateway.toml`, loaded, and its focus route: the first
/// with limits, where generated traffic goes.
fn repository_config() -> (String, tollgate::config::Config, usize) {
    let path = format!("{}/gateway.toml", env!("CARGO_MANIFEST_DIR"));
    let config = tollgate::config::Config::load(std::path::Path::new(&path)).unwrap();
    let route = config
        .routes
        .iter()
        .position(|r| !r.limits.is_empty())
        .unwrap();
    (path, config, route)
}

/// The row of limit `name` in a `--json` report.
fn limit_row<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["limit"] == name)
        .unwrap_or_else(|| panic!("no row for {name}: {report}"))
}

/// Found trying it as a new user: `keys=50` against `gateway.toml` varied
/// the client address but sent every request with the one consumer's API
/// key, so the API-key limit saw one key and denied 11,914 of 11,944
/// requests. Now client N sends the N-th consumer's key, then unknown keys
/// (which `unknown_key = "anonymous"` admits, counted per key by the
/// `header:x-api-key` limit): 50 keys of every limit that reads a client's.
#[test]
fn generated_keys_spread_the_api_key_limit_over_every_key() {
    let (path, config, route) = repository_config();
    let keys = 50;
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &path,
        "--generate",
        &format!("poisson:rate=200/s,keys={keys}"),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report = json(&stdout);
    let route_config = &config.routes[route];
    let api_key_limit = route_config
        .limits
        .iter()
        .map(|&i| &config.limits[i])
        .find(|l| {
            l.key
                == [tollgate::config::KeyPart::Header(
                    "x-api-key".parse().unwrap(),
                )]
        })
        .expect("gateway.toml keys a limit on x-api-key");
    let tollgate::limit::Algorithm::TokenBucket {
        capacity, refill, ..
    } = api_key_limit.algorithm
    else {
        panic!("{} is a token bucket", api_key_limit.name);
    };
    // What one key could ever be admitted over the run: the bucket full,
    // then what refills, each request costing the route's cost.
    let span = report["span_seconds"].as_f64().unwrap();
    let refilled = refill.tokens as f64 * span * 1e9 / refill.per as f64;
    let one_key = (capacity as f64 + refilled) / route_config.cost as f64;
    let row = limit_row(&report, &api_key_limit.name);
    assert_eq!(row["keys"], keys, "{row}");
    let admitted = report["routes"][0]["admitted"].as_f64().unwrap();
    assert!(
        admitted > 2.0 * one_key,
        "admitted {admitted}: more than one key's {one_key:.0}"
    );
    let requests = row["requests"].as_f64().unwrap();
    let denied = row["denied"].as_f64().unwrap();
    assert!(
        denied < (requests - one_key) / 2.0,
        "{denied} of {requests} denied by the API-key limit"
    );
    assert_eq!(limit_row(&report, "per_ip")["keys"], keys);
    // The consumer's key first, then unknown ones.
    let generated = &report["generated"];
    assert_eq!(generated["keys"], keys);
    assert_eq!(
        generated["varied"],
        serde_json::json!(["header:x-api-key", "ip"])
    );
    assert_eq!(generated["fixed"], serde_json::json!([]));
    let consumers = config.consumers.len() as u64;
    assert_eq!(generated["api_key"]["consumers"], consumers);
    assert_eq!(generated["api_key"]["unknown_keys"], keys - consumers);
    assert_eq!(generated["api_key"]["unknown_refused"], false);
    assert_eq!(report["routes"][0]["unauthorized"], 0);

    // The table's header line says the same.
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &path,
        "--generate",
        &format!("poisson:rate=200/s,keys={keys}"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let first = stdout.lines().next().unwrap();
    assert!(
        first.ends_with(&format!(
            "; generated: poisson 200/s for 1m, {keys} keys varying header:x-api-key \
             ({consumers} consumer, then unknown keys), ip"
        )),
        "{first}"
    );
}

#[test]
fn vary_chooses_which_key_kinds_differ() {
    let (path, _, _) = repository_config();
    let run = |vary: &str| {
        let (code, stdout, stderr) = tollgate(&[
            "simulate",
            "-c",
            &path,
            "--generate",
            &format!("poisson:rate=50/s,keys=20,duration=10s,vary={vary}"),
            "--json",
        ]);
        assert_eq!(code, 0, "{stderr}");
        json(&stdout)
    };
    let report = run("ip");
    assert_eq!(limit_row(&report, "per_ip")["keys"], 20);
    assert_eq!(limit_row(&report, "per_key")["keys"], 1);
    assert_eq!(report["generated"]["varied"], serde_json::json!(["ip"]));
    assert_eq!(
        report["generated"]["fixed"],
        serde_json::json!(["header:x-api-key"])
    );
    assert!(
        report["generated"]["summary"]
            .as_str()
            .unwrap()
            .ends_with("20 keys varying ip; fixed: header:x-api-key (one consumer)"),
        "{}",
        report["generated"]
    );
    let report = run("header:X-Api-Key");
    assert_eq!(limit_row(&report, "per_ip")["keys"], 1);
    assert_eq!(limit_row(&report, "per_key")["keys"], 20);
    assert_eq!(report["generated"]["fixed"], serde_json::json!(["ip"]));
    // Both, listed: the same as the default.
    let both = run("ip,header:x-api-key");
    assert_eq!(limit_row(&both, "per_ip")["keys"], 20);
    assert_eq!(limit_row(&both, "per_key")["keys"], 20);

    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &path,
        "--generate",
        "poisson:rate=5/s,vary=cookie:sid",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains(
            "vary: the limits of route `reports` do not read `cookie:sid`; \
             they read header:x-api-key, ip"
        ),
        "{stderr}"
    );
}

/// Where the gateway answers an unknown API key with 401, unknown keys
/// would exercise no limit: the consumers' keys are cycled, and the header
/// line says so.
#[test]
fn where_unknown_keys_are_refused_the_consumers_keys_are_cycled() {
    let (_dir, config) = config_file(
        r#"
[api_keys]
unknown_key = "reject"

[consumers."k-1"]
consumer = "one"

[consumers."k-2"]
consumer = "two"

[limits.per_consumer]
key = "consumer"
algorithm = "fixed_window"
limit = 1000
window = "1h"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["per_consumer"]
"#,
    );
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--generate",
        "poisson:rate=10/s,keys=5,duration=10s",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report = json(&stdout);
    assert_eq!(report["routes"][0]["unauthorized"], 0, "{report}");
    assert_eq!(report["rows"][0]["keys"], 2);
    let generated = &report["generated"];
    assert_eq!(generated["api_key"]["unknown_refused"], true);
    assert_eq!(generated["api_key"]["unknown_keys"], 0);
    assert!(
        generated["summary"].as_str().unwrap().ends_with(
            "5 keys varying header:x-api-key (2 consumers, cycled: unknown keys get 401)"
        ),
        "{generated}"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (dir, config) = config_file(WINDOW_100);
    let cases: [(&[&str], i32, &str); 6] = [
        (
            &["--generate", "boundary-burst", "--route", "ap"],
            2,
            "unknown route `ap`, expected one of api (did you mean `api`?)",
        ),
        (
            &[
                "--generate",
                "boundary-burst",
                "--compare",
                "fixed,sliding_log",
            ],
            2,
            "unknown algorithm `fixed`",
        ),
        (
            &["--generate", "poisson:keys=3"],
            2,
            "poisson needs `rate=R`",
        ),
        (&["--generate", "bursty"], 2, "unknown generator `bursty`"),
        (
            &["--trace", "no-such-file.csv"],
            1,
            "cannot read no-such-file.csv",
        ),
        (&[], 2, "--trace"),
    ];
    for (args, expected_code, needle) in cases {
        let mut all = vec!["simulate", "-c", config.as_str()];
        all.extend_from_slice(args);
        let (code, stdout, stderr) = tollgate(&all);
        assert_eq!(code, expected_code, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
    }
    // A gzip file cut short stops the run with a message, not a panic.
    let cut = dir.path().join("cut.gz");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for _ in 0..200 {
        encoder.write_all(small_trace().as_bytes()).unwrap();
    }
    let bytes = encoder.finish().unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (code, _, stderr) =
        tollgate(&["simulate", "-c", &config, "--trace", cut.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot read the trace"), "{stderr}");
}

#[test]
fn the_example_trace_runs_against_the_repository_config() {
    let root = env!("CARGO_MANIFEST_DIR");
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &format!("{root}/gateway.toml"),
        "--trace",
        &format!("{root}/examples/trace.csv"),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report = json(&stdout);
    assert_eq!(report["bad_records"], 0, "{stderr}");
    assert!(report["records"].as_u64().unwrap() >= 50);
    assert!(
        report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["denied"].as_u64() > Some(0)),
        "the example shows a denial: {report}"
    );
}

/// A shadow limit never denies, not even for a missing key under "deny":
/// the simulation admits those requests and counts them against the shadow
/// limit as the denials they would have been, as the gateway does.
#[test]
fn a_shadow_limit_counts_the_missing_keys_it_would_have_refused() {
    let (dir, config) = config_file(
        r#"
[limits.audit]
key = "header:x-audit"
algorithm = "fixed_window"
limit = 100
window = "1d"
shadow = true
on_missing_key = "deny"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["audit"]
"#,
    );
    let trace = dir.path().join("trace.jsonl");
    let lines: String = (0..3)
        .map(|i| {
            format!(
                "{{\"time\": 1772359200.{i}, \"method\": \"GET\", \"path\": \"/x\", \"ip\": \"192.0.2.1\"}}\n"
            )
        })
        .collect();
    std::fs::write(&trace, lines).unwrap();
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report = json(&stdout);
    let route = &report["routes"][0];
    assert_eq!(route["admitted"], 3, "{report}");
    assert_eq!(route["missing_key"], 0, "{report}");
    let limit = &report["rows"][0];
    assert_eq!(limit["shadow"], true, "{report}");
    assert_eq!(limit["requests"], 3, "{report}");
    assert_eq!(limit["denied"], 3, "{report}");
}

#[test]
fn tokens_are_verified_at_each_records_time() {
    let secret = b"simulate-secret-of-thirty-two-bytes!";
    let (dir, config) = config_file(
        r#"
[[jwt.issuers]]
issuer = "https://sso.example/"
secret_file = "secret"

[limits.per_user]
key = "jwt:sub"
algorithm = "fixed_window"
limit = 2
window = "1h"
on_missing_key = "deny"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["per_user"]
"#,
    );
    std::fs::write(dir.path().join("secret"), secret).unwrap();
    let start = 1_772_359_200u64;
    let token = |sub: &str, exp: u64| {
        common::jwt::hs256(
            secret,
            &serde_json::json!({"iss": "https://sso.example/", "sub": sub, "exp": exp}),
        )
    };
    // Alice thrice (one over her 2), Bob once, Carol with a token that
    // expired (beyond the 30 s leeway) before her request: no key,
    // refused for it (400).
    let sent = [
        ("alice", start + 600),
        ("alice", start + 600),
        ("bob", start + 600),
        ("alice", start + 600),
        ("carol", start - 60),
    ];
    let lines: String = sent
        .iter()
        .enumerate()
        .map(|(i, (sub, exp))| {
            serde_json::json!({
                "time": start as f64 + i as f64,
                "method": "GET",
                "path": "/x",
                "ip": "192.0.2.1",
                "headers": {"authorization": format!("Bearer {}", token(sub, *exp))},
            })
            .to_string()
                + "\n"
        })
        .collect();
    let trace = dir.path().join("trace.jsonl");
    std::fs::write(&trace, lines).unwrap();
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report = json(&stdout);
    let route = &report["routes"][0];
    assert_eq!(route["admitted"], 3, "{report}");
    assert_eq!(route["missing_key"], 1, "{report}");
    assert_eq!(report["rows"][0]["denied"], 1, "{report}");
}

/// A chat route with a request limit and a token limit per `x-user`: 1000
/// tokens a minute in one fixed window, so every count is exact.
const TPM: &str = r#"
[limits.rpm]
key = "header:x-user"
algorithm = "fixed_window"
limit = 100
window = "1m"

[limits.tpm]
key = "header:x-user"
algorithm = "fixed_window"
limit = 1000
window = "1m"
unit = "tokens"

[[routes]]
name = "chat"
match = { path = "/v1/chat/completions", methods = ["POST"] }
respond = { status = 200 }
limits = ["rpm", "tpm"]
tokens = { max_tokens_default = 100, prompt = "bytes/4", usage = "auto" }
"#;

/// A chat body asking for `max_tokens` with an 8-byte prompt (2 tokens).
fn chat_body(max_tokens: u64) -> String {
    serde_json::json!({
        "model": "m",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "abcdefgh"}],
    })
    .to_string()
}

/// Runs `records` (time, max_tokens, tokens used) of user u1 through `TPM`:
/// the JSON report and the decisions.
fn run_tpm(records: &[(f64, u64, Option<u64>)]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let (dir, config) = config_file(TPM);
    let trace_path = dir.path().join("trace.jsonl");
    let mut trace = String::new();
    for &(time, max_tokens, used) in records {
        let mut record = serde_json::json!({
            "time": time,
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": {"x-user": "u1", "content-type": "application/json"},
            "body": chat_body(max_tokens),
        });
        if let Some(used) = used {
            record["tokens"] = used.into();
        }
        trace.push_str(&record.to_string());
        trace.push('\n');
    }
    std::fs::write(&trace_path, trace).unwrap();
    let decisions_path = dir.path().join("decisions.jsonl");
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--trace",
        trace_path.to_str().unwrap(),
        "--decisions",
        decisions_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    let decisions = std::fs::read_to_string(&decisions_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (json(&stdout), decisions)
}

fn outcomes(decisions: &[serde_json::Value]) -> Vec<&str> {
    decisions
        .iter()
        .map(|d| d["outcome"].as_str().unwrap())
        .collect()
}

#[test]
fn token_limits_are_charged_the_reservation_and_settled_on_the_traces_tokens() {
    // In the window [0 s, 60 s): A reserves 400 + 2 and used 100 (a refund
    // of 302); B reserves 802, which fits only thanks to that refund (100 +
    // 802), and used 1500 (a debt of 698: the window holds 1600); C's 12
    // then does not fit, which it would without the debt (902 + 12). D, in
    // a later window, says nothing of its usage: its reservation stands.
    let records = [
        (1.0, 400, Some(100)),
        (2.0, 800, Some(1500)),
        (3.0, 10, Some(5)),
        (125.0, 10, None),
    ];
    let (report, decisions) = run_tpm(&records);
    assert_eq!(
        outcomes(&decisions),
        ["admitted", "admitted", "denied", "admitted"]
    );
    assert_eq!(decisions[2]["limit"], "tpm");
    assert_eq!(decisions[2]["status"], 429);
    // The reservations, computed by hand as the gateway computes them
    // (max_tokens plus ceil(8 bytes / 4)); the usage of the admitted.
    let reserved: Vec<u64> = decisions
        .iter()
        .map(|d| d["tokens_reserved"].as_u64().unwrap())
        .collect();
    assert_eq!(reserved, [402, 802, 12, 12]);
    let used: Vec<Option<u64>> = decisions
        .iter()
        .map(|d| d["tokens_used"].as_u64())
        .collect();
    assert_eq!(used, [Some(100), Some(1500), None, None]);

    let tpm = limit_row(&report, "tpm");
    assert_eq!(
        (tpm["requests"].as_u64(), tpm["admitted"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(tpm["denied"], 1);
    assert_eq!(
        tpm["tokens"],
        serde_json::json!({"reserved": 402 + 802 + 12, "used": 1600, "settled": 2, "unsettled": 1})
    );
    // Its window's peak is in tokens, as used: 100 + 1500.
    assert_eq!(tpm["peak"], 1600);
    assert_eq!(tpm["window_limit"], 1000);
    // The request limit is charged 1 a request, and has no tokens.
    let rpm = limit_row(&report, "rpm");
    assert_eq!(rpm["peak"], 2);
    assert_eq!(rpm["admitted"], 3);
    assert!(rpm.get("tokens").is_none(), "{rpm}");

    // Without the usage every reservation stands: B no longer fits (402 +
    // 802), and C does (402 + 12).
    let unsettled: Vec<_> = records.iter().map(|&(t, m, _)| (t, m, None)).collect();
    let (report, decisions) = run_tpm(&unsettled);
    assert_eq!(
        outcomes(&decisions),
        ["admitted", "denied", "admitted", "admitted"]
    );
    assert_eq!(
        limit_row(&report, "tpm")["tokens"],
        serde_json::json!({"reserved": 402 + 12 + 12, "used": 0, "settled": 0, "unsettled": 3})
    );
}

#[test]
fn the_table_reports_a_token_limits_tokens() {
    let (dir, config) = config_file(TPM);
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &trace,
        format!(
            "time,method,path,header:x-user,body,tokens\n1,POST,/v1/chat/completions,u1,\"{}\",90\n",
            chat_body(400).replace('"', "\"\"")
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(
            "route chat, limit tpm: tokens reserved 402, used 90; requests settled 1, unsettled 0 (kept their reservation); peak, limit and excess in tokens"
        ),
        "{stdout}"
    );
}

/// A spend budget of $0.03 an hour per user, with `[prices]` for one model
/// and a default for the rest.
const SPEND: &str = r#"
[prices."gpt-4o"]
input = 2.50
output = 10.00
cached_input = 1.25

[prices.default]
input = 5
output = 15

[limits.spend]
key = "header:x-user"
algorithm = "fixed_window"
limit = 0.03
window = "1h"
unit = "usd"

[[routes]]
name = "chat"
match = { path = "/v1/chat/completions", methods = ["POST"] }
respond = { status = 200 }
limits = ["spend"]
tokens = { max_tokens_default = 100, prompt = "bytes/4", usage = "auto" }
"#;

#[test]
fn simulate_prices_the_traces_tokens_and_reports_spend_per_key() {
    let (dir, config) = config_file(SPEND);
    // (time, user, model, tokens): each body asks for 1,000 tokens with a
    // 2-token prompt. The trace's `tokens` is a total, priced as the
    // gateway prices one: the prompt's estimate as input, the rest output.
    //   u1 on gpt-4o reserves 2 × 2.5 + 1,000 × 10 = 10,005 µ$ and spends
    //   2 × 2.5 + 598 × 10 = 5,985 of its 600 tokens: after k requests the
    //   next fits while 5,985·k + 10,005 ≤ 30,000, so four are admitted
    //   (23,940 spent) and the fifth is denied (33,945).
    //   u2's model has no price of its own, the default's: it reserves
    //   2 × 5 + 1,000 × 15 = 15,010 and spends 2 × 5 + 98 × 15 = 1,480 of
    //   100 tokens; its last record says nothing of its usage, so its
    //   reservation stands: 1,480 + 15,010 = 16,490.
    let records: [(u64, &str, &str, Option<u64>); 7] = [
        (1, "u1", "gpt-4o", Some(600)),
        (2, "u2", "llama-3", Some(100)),
        (3, "u1", "gpt-4o", Some(600)),
        (4, "u1", "gpt-4o", Some(600)),
        (5, "u1", "gpt-4o", Some(600)),
        (6, "u1", "gpt-4o", Some(600)),
        (7, "u2", "llama-3", None),
    ];
    let mut trace = String::new();
    for (time, user, model, tokens) in records {
        let body = serde_json::json!({
            "model": model,
            "max_tokens": 1000,
            "messages": [{"role": "user", "content": "abcdefgh"}],
        });
        let mut record = serde_json::json!({
            "time": time,
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": {"x-user": user, "content-type": "application/json"},
            "body": body.to_string(),
        });
        if let Some(tokens) = tokens {
            record["tokens"] = tokens.into();
        }
        trace.push_str(&record.to_string());
        trace.push('\n');
    }
    let trace_path = dir.path().join("trace.jsonl");
    std::fs::write(&trace_path, trace).unwrap();
    let decisions_path = dir.path().join("decisions.jsonl");
    let run = |json: bool| {
        let mut args = vec![
            "simulate",
            "-c",
            &config,
            "--trace",
            trace_path.to_str().unwrap(),
            "--decisions",
            decisions_path.to_str().unwrap(),
        ];
        if json {
            args.push("--json");
        }
        let (code, stdout, stderr) = tollgate(&args);
        assert_eq!(code, 0, "{stderr}\n{stdout}");
        stdout
    };
    let report = json(&run(true));
    let decisions: Vec<serde_json::Value> = std::fs::read_to_string(&decisions_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        outcomes(&decisions),
        [
            "admitted", "admitted", "admitted", "admitted", "admitted", "denied", "admitted"
        ]
    );
    assert_eq!(decisions[5]["limit"], "spend");
    let spend = limit_row(&report, "spend");
    assert_eq!(
        (spend["requests"].as_u64(), spend["admitted"].as_u64()),
        (Some(7), Some(6))
    );
    // Reserved: 4 × 10,005 + 2 × 15,010; spent: 23,940 + 16,490.
    assert_eq!(spend["usd"]["reserved"], "0.07004", "{spend}");
    assert_eq!(spend["usd"]["spent"], "0.04043", "{spend}");
    assert_eq!(
        (
            spend["usd"]["settled"].as_u64(),
            spend["usd"]["unsettled"].as_u64()
        ),
        (Some(5), Some(1))
    );
    // Per key, most first: the digest of the header's value (as the admin
    // API's explain names a key), never the value itself.
    let digest = |user: &str| {
        format!(
            "{:032x}",
            tollgate::limit::LimitKey::digest(&[user.as_bytes()]).as_u128()
        )
    };
    assert_eq!(
        spend["usd"]["keys"],
        serde_json::json!([
            {"digest": digest("u1"), "spent": "0.02394"},
            {"digest": digest("u2"), "spent": "0.01649"},
        ])
    );
    // The table says the same in words.
    let table = run(false);
    for line in [
        "route chat, limit spend: spent $0.04043 (reserved $0.07004); requests settled 5, unsettled 1 (kept their reservation); peak, limit and excess in micro-dollars".to_owned(),
        format!("  key {}: spent $0.02394", digest("u1")),
        format!("  key {}: spent $0.01649", digest("u2")),
    ] {
        assert!(table.contains(&line), "{line}\nnot in:\n{table}");
    }
    assert!(!table.contains("u1") && !table.contains("u2"), "{table}");
}

/// One chat request of the live comparison: its API key, `max_tokens`, how
/// the scripted upstream reports its usage and how much.
struct Chat {
    key: &'static str,
    max_tokens: u64,
    script: &'static str,
    used: u64,
}

#[tokio::test]
async fn token_decisions_and_tokens_equal_the_live_gateways() {
    let upstream = common::llm::LlmUpstream::start().await;
    let config = format!(
        r#"[server]
listen = "127.0.0.1:0"
workers = 1

[upstreams.llm]
url = "{}"

[limits.tpm]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1000
refill = "1000/d"
unit = "tokens"

[[routes]]
name = "chat"
match = {{ path = "/v1/chat/completions", methods = ["POST"] }}
upstream = "llm"
limits = ["tpm"]
tokens = {{ max_tokens_default = 100, prompt = "bytes/4", usage = "auto" }}
"#,
        upstream.url()
    );
    // Each reserves max_tokens + 2. k1: a refund, then a debt that denies
    // the next; k2: a reservation that stands, a denial by 4 tokens, a
    // request that used nothing.
    let chats = [
        Chat {
            key: "k1",
            max_tokens: 400,
            script: "json",
            used: 100,
        },
        Chat {
            key: "k1",
            max_tokens: 800,
            script: "json",
            used: 1500,
        },
        Chat {
            key: "k1",
            max_tokens: 10,
            script: "json",
            used: 5,
        },
        Chat {
            key: "k2",
            max_tokens: 300,
            script: "none",
            used: 0,
        },
        Chat {
            key: "k2",
            max_tokens: 700,
            script: "json",
            used: 1,
        },
        Chat {
            key: "k2",
            max_tokens: 690,
            script: "json",
            used: 0,
        },
    ];
    let gateway = InProcess::start(&config).await;
    let tokens = |kind: &str| {
        let text = gateway.app.metrics().encode();
        let exposition = common::openmetrics::parse(&text).expect("a valid exposition");
        exposition.count(
            "tollgate_tokens_total",
            &[("route", "chat"), ("limit", "tpm"), ("kind", kind)],
        ) as u64
    };
    let settlements = || tokens("refunded") + tokens("charged") + tokens("unsettled");
    let mut statuses = Vec::new();
    for chat in &chats {
        let before = if statuses.is_empty() {
            0
        } else {
            settlements()
        };
        let request = Request::post("/v1/chat/completions")
            .header("host", "gateway.test")
            .header("content-type", "application/json")
            .header("x-api-key", chat.key)
            .header("x-script", chat.script)
            .header("x-used", chat.used.to_string())
            .body(Full::new(Bytes::from(chat_body(chat.max_tokens))))
            .unwrap();
        let reply = send(gateway.addr, request).await;
        if reply.status == 200 {
            // Settled when the body is dropped, after the client read it:
            // the next request must meet its refund or debt.
            let settled = common::eventually(async || settlements() > before).await;
            assert!(settled, "request {} never settled", statuses.len() + 1);
        }
        statuses.push(reply.status);
    }
    assert_eq!(statuses, [200, 200, 429, 200, 429, 200]);
    let live = serde_json::json!({
        "reserved": tokens("reserved"),
        "used": tokens("reserved") + tokens("charged") - tokens("refunded") - tokens("unsettled"),
        "unsettled": tokens("unsettled"),
    });
    gateway.stop().await;

    // The same requests as a trace, with what each response used.
    let (dir, config_path) = config_file(&config);
    let trace_path = dir.path().join("trace.jsonl");
    let mut trace = String::new();
    for (i, chat) in chats.iter().enumerate() {
        let mut record = serde_json::json!({
            "time": 1_772_359_200.0 + i as f64 * 0.01,
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": {"host": "gateway.test", "content-type": "application/json", "x-api-key": chat.key},
            "body": chat_body(chat.max_tokens),
        });
        if chat.script != "none" {
            record["tokens"] = chat.used.into();
        }
        trace.push_str(&record.to_string());
        trace.push('\n');
    }
    std::fs::write(&trace_path, trace).unwrap();
    let decisions_path = dir.path().join("decisions.jsonl");
    let (code, stdout, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config_path,
        "--trace",
        trace_path.to_str().unwrap(),
        "--decisions",
        decisions_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    let simulated: Vec<u16> = std::fs::read_to_string(&decisions_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|d| d["status"].as_u64().map_or(200, |s| s as u16))
        .collect();
    assert_eq!(simulated, statuses);
    let report = json(&stdout);
    let row = &limit_row(&report, "tpm")["tokens"];
    // The live gateway counts the unsettled in tokens, the report in
    // requests: k2's first, which reserved 302.
    assert_eq!(row["unsettled"], 1);
    assert_eq!(live["unsettled"], 302);
    assert_eq!(row["reserved"], live["reserved"], "{report}");
    assert_eq!(row["used"], live["used"], "{report}");
}
