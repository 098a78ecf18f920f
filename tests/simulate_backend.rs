//! End-to-end tests of `tollgate simulate --backend`, through the built
//! binary: a modelled upstream makes `concurrency` limits decide on what
//! is in flight, `--compare none,concurrency=N` compares them against no
//! limit, `--generate capacity-drop` halves the upstream halfway, and the
//! report (table, JSON, SVG) shows goodput, shed requests and latency.

mod common;

use common::tollgate;

/// `text` as `gateway.toml` in a fresh directory; returns (dir, path).
fn config_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).expect("write config");
    let path = path.to_str().expect("utf-8 path").to_owned();
    (dir, path)
}

const CONCURRENCY_5: &str = r#"
[limits.backend]
key = "route"
algorithm = "concurrency"
max = 5

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["backend"]
"#;

const WINDOW_ONLY: &str = r#"
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

/// The `backend` row of `variant` (`None`: the only one).
fn backend<'a>(report: &'a serde_json::Value, variant: Option<&str>) -> &'a serde_json::Value {
    let rows = report["backend"].as_array().expect("backend rows");
    match variant {
        None => {
            assert_eq!(rows.len(), 1, "{rows:?}");
            &rows[0]
        }
        Some(name) => rows
            .iter()
            .find(|r| r["variant"] == name)
            .unwrap_or_else(|| panic!("no backend row for {name}: {rows:?}")),
    }
}

fn simulate_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, stdout, stderr) = tollgate(&all);
    assert_eq!(code, 0, "{stderr}");
    json(&stdout)
}

#[test]
fn a_concurrency_limit_decides_on_the_requests_in_flight() {
    let (_dir, config) = config_file(CONCURRENCY_5);
    // 100/s at an upstream of 5 × 100 ms (50/s): twice its capacity.
    let traffic = "poisson:rate=100/s,duration=20s";
    let without = simulate_json(&["-c", &config, "--generate", traffic]);
    assert_eq!(without["routes"][0]["denied"], 0, "no upstream: never full");
    assert!(without.get("backend").is_none(), "{without}");

    let report = simulate_json(&[
        "-c",
        &config,
        "--generate",
        traffic,
        "--backend",
        "capacity=5,latency=100ms",
        "--compare",
        "none,concurrency=5",
    ]);
    let limited = backend(&report, Some("concurrency=5"));
    let open = backend(&report, Some("none"));
    let requests = report["records"].as_u64().unwrap();
    assert!(requests > 1800, "{requests}");
    // The limit holds the upstream at its capacity and sheds the rest,
    // each counted with its status.
    assert_eq!(limited["peak_in_flight"], 5);
    let shed = limited["shed"].as_u64().unwrap();
    assert_eq!(limited["sent"].as_u64().unwrap() + shed, requests);
    assert!(shed > requests / 3, "{limited}");
    assert_eq!(limited["shed_by"][0]["status"], 429);
    assert_eq!(limited["shed_by"][0]["route"], "api");
    assert_eq!(limited["shed_by"][0]["requests"].as_u64(), Some(shed));
    // No limit: everything is sent, the upstream's queue grows without
    // end, and almost nothing is answered within the SLO.
    assert_eq!(open["sent"].as_u64(), Some(requests));
    assert_eq!(open["shed"], 0);
    assert!(open["peak_in_flight"].as_u64().unwrap() > 500, "{open}");
    let share = |row: &serde_json::Value| row["goodput_share"].as_f64().unwrap();
    let p99 = |row: &serde_json::Value| row["latency_p99_ms"].as_f64().unwrap();
    assert!(share(limited) > 0.8, "{limited}");
    assert!(share(open) < 0.3, "{open}");
    assert!(p99(limited) < 1000.0 && p99(open) > 5000.0, "{report}");
    assert_eq!(limited["capacity_per_second"], 50.0);
}

#[test]
fn a_run_is_repeatable_and_its_seed_changes_it() {
    let (_dir, config) = config_file(CONCURRENCY_5);
    let run = |backend: &str| {
        let (code, stdout, stderr) = tollgate(&[
            "simulate",
            "-c",
            &config,
            "--generate",
            "poisson:rate=60/s,duration=10s",
            "--backend",
            backend,
        ]);
        assert_eq!(code, 0, "{stderr}");
        stdout
    };
    let first = run("capacity=5,latency=100ms");
    assert_eq!(first, run("capacity=5,latency=100ms"));
    assert_ne!(first, run("capacity=5,latency=100ms,seed=2"));
    assert!(first.contains("modelled upstream: capacity 5, mean service 100ms (50.0/s over the run), goodput = 2xx within 500ms"), "{first}");
    assert!(first.contains("peak in flight"), "{first}");
}

#[test]
fn a_full_upstream_queue_answers_503_and_a_limit_keeps_it_from_filling() {
    let (_dir, config) = config_file(CONCURRENCY_5);
    let report = simulate_json(&[
        "-c",
        &config,
        "--generate",
        "poisson:rate=100/s,duration=10s",
        "--backend",
        "capacity=5,latency=100ms,queue=10",
        "--compare",
        "none,concurrency=5",
    ]);
    let open = backend(&report, Some("none"));
    let refused = open["upstream_refused"].as_u64().unwrap();
    assert!(refused > 200, "{open}");
    assert_eq!(
        open["ok"].as_u64().unwrap() + refused,
        open["sent"].as_u64().unwrap()
    );
    // At most 5 served and 10 waiting: the latency stays bounded.
    assert!(open["latency_p99_ms"].as_f64().unwrap() < 1500.0, "{open}");
    let limited = backend(&report, Some("concurrency=5"));
    assert_eq!(limited["upstream_refused"], 0);
}

#[test]
fn capacity_drop_halves_the_upstream_and_the_chart_shows_it() {
    let (dir, config) = config_file(CONCURRENCY_5);
    let svg = dir.path().join("drop.svg");
    let report = simulate_json(&[
        "-c",
        &config,
        "--generate",
        "capacity-drop:capacity=10,latency=100ms,duration=40s",
        "--compare",
        "none,concurrency=10",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(report["generated"]["generator"], "capacity-drop");
    let limited = backend(&report, Some("concurrency=10"));
    let steps = limited["capacity"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(steps[1]["capacity"], 5);
    let at = steps[1]["from_seconds"].as_f64().unwrap();
    assert!((at - 20.0).abs() < 0.1, "the drop at {at} s");
    // 0.8 of 100/s for 40 s; the mean capacity over the run is 75/s.
    let records = report["records"].as_f64().unwrap();
    assert!((records / 3200.0 - 1.0).abs() < 0.05, "{records}");
    assert!((limited["capacity_per_second"].as_f64().unwrap() - 75.0).abs() < 0.5);
    assert_eq!(limited["peak_in_flight"], 10);
    // Without a limit the second half's 1.6× overload piles up.
    let open = backend(&report, Some("none"));
    assert!(open["peak_in_flight"].as_u64().unwrap() > 100, "{open}");

    let text = std::fs::read_to_string(&svg).unwrap();
    let document = roxmltree::Document::parse(&text).expect("the SVG parses as XML");
    let texts: Vec<&str> = document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("requests in flight to the modelled upstream")),
        "{texts:?}"
    );
    // The capacity in grey: a step from 10 down to 5.
    let grey: Vec<&str> = document
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some("#999999"))
        .filter_map(|n| n.attribute("points"))
        .collect();
    assert_eq!(grey.len(), 1, "{grey:?}");
    assert_eq!(grey[0].split_whitespace().count(), 4, "{grey:?}");
}

#[test]
fn bad_backend_arguments_are_usage_errors() {
    let (_dir, config) = config_file(CONCURRENCY_5);
    let (_w, window) = config_file(WINDOW_ONLY);
    for (config, args, says) in [
        (
            &config,
            vec!["--backend", "capacity=5"],
            "needs capacity=N and latency=DUR",
        ),
        (
            &config,
            vec!["--backend", "capacity=5,latency=soon"],
            "not a duration",
        ),
        (
            &config,
            vec!["--backend", "capacity=5,latency=1s,depth=3"],
            "unknown `depth`",
        ),
        (
            &config,
            vec!["--compare", "concurrency=0"],
            "needs a whole number above 0",
        ),
        (
            &window,
            vec!["--compare", "concurrency=10"],
            "the configuration has none",
        ),
    ] {
        let mut all = vec!["simulate", "-c", config, "--generate", "poisson:rate=5/s"];
        all.extend(args.iter().copied());
        let (code, stdout, stderr) = tollgate(&all);
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = tollgate(&[
        "simulate",
        "-c",
        &config,
        "--generate",
        "capacity-drop:load=0",
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("`load=0` must be a number above 0"),
        "{stderr}"
    );
}

const ADAPTIVE: &str = r#"
[limits.backend]
key = "route"
algorithm = "adaptive"
min = 2
max = 50

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["backend"]
"#;

#[test]
fn static_and_adaptive_limits_compare_in_one_table() {
    // 100/s at an upstream of 5 × 100 ms (50/s): twice its capacity.
    let traffic = "poisson:rate=100/s,duration=20s";
    let args = |config: &str| {
        [
            "-c",
            config,
            "--generate",
            traffic,
            "--backend",
            "capacity=5,latency=100ms",
            "--compare",
            "none,concurrency=5,adaptive",
        ]
        .map(str::to_owned)
    };
    // Written with a static limit, and written adaptive: the same three rows.
    for written in [CONCURRENCY_5, ADAPTIVE] {
        let (_dir, config) = config_file(written);
        let args = args(&config);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report = simulate_json(&args);
        let requests = report["records"].as_u64().unwrap();
        let fixed = backend(&report, Some("concurrency=5"));
        let adaptive = backend(&report, Some("adaptive"));
        let open = backend(&report, Some("none"));
        for row in [fixed, adaptive, open] {
            let (sent, shed) = (row["sent"].as_u64().unwrap(), row["shed"].as_u64().unwrap());
            assert_eq!(sent + shed, requests, "{row}");
        }
        assert_eq!(fixed["peak_in_flight"], 5, "{written}");
        // At twice the capacity the adaptive limit sheds, where no limit
        // sends everything.
        assert!(adaptive["shed"].as_u64().unwrap() > 0, "{adaptive}");
        assert_eq!(open["shed"], 0);
        let (code, table, stderr) = tollgate(&[&["simulate"][..], &args[..]].concat());
        assert_eq!(code, 0, "{stderr}");
        for variant in ["none ", "concurrency=5 ", "adaptive "] {
            assert!(
                table.lines().any(|line| line.starts_with(variant)),
                "{variant}\n{table}"
            );
        }
    }
}

/// A slot limit's `queue` is not modelled: with `--backend` the run says so
/// on stderr and counts the requests the queue would hold as shed, the
/// same report as without the queue; without `--backend` (where a slot
/// limit never refuses) it says nothing.
#[test]
fn a_queue_is_named_as_not_modelled() {
    let queued = CONCURRENCY_5.replace("max = 5\n", "max = 5\nqueue = { max_wait = \"500ms\" }\n");
    assert_ne!(queued, CONCURRENCY_5);
    let (_with, with_queue) = config_file(&queued);
    let (_without, without_queue) = config_file(CONCURRENCY_5);
    let run = |config: &str, backend: bool| {
        let mut args = vec![
            "simulate",
            "-c",
            config,
            "--generate",
            "poisson:rate=100/s,duration=5s",
            "--json",
        ];
        if backend {
            args.extend(["--backend", "capacity=5,latency=100ms"]);
        }
        let (code, stdout, stderr) = tollgate(&args);
        assert_eq!(code, 0, "{stderr}");
        (json(&stdout), stderr)
    };
    let (report, stderr) = run(&with_queue, true);
    assert!(
        stderr.contains("limit `backend`: its queue is not modelled"),
        "{stderr}"
    );
    let (plain, plain_stderr) = run(&without_queue, true);
    assert!(!plain_stderr.contains("not modelled"), "{plain_stderr}");
    assert!(
        backend(&report, None)["shed"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert_eq!(report["backend"], plain["backend"]);
    let (_, quiet) = run(&with_queue, false);
    assert!(!quiet.contains("not modelled"), "{quiet}");
}
