//! The `tollgate` binary: the command line, logging and signals around the
//! library. `run` serves, `check` validates, `simulate` replays traffic
//! offline, `import` converts another rate limiter's configuration, `admin`
//! asks the running gateway's admin API.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

use tollgate::Listeners;
use tollgate::app::App;
use tollgate::config::Config;

// mimalloc: per-thread free lists make the request path's small, short-lived
// allocations (header maps, response parts, buffers) cheaper than glibc's
// malloc, which the allow-path profile showed at ~4% of the gateway's CPU.
#[global_allocator]
static ALLOCATOR: tollgate::allocator::Allocator = tollgate::allocator::Allocator;

/// A rate-limiting reverse proxy and API gateway.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The configuration file.
    #[arg(short, long, global = true, default_value = "gateway.toml")]
    config: PathBuf,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve traffic (the default).
    Run,
    /// Validate the configuration, print a summary, exit 0 (valid) or 1.
    Check,
    /// Replay a trace (or generated traffic) through the configuration on a
    /// virtual clock and report what its limits would have done.
    Simulate(SimulateArgs),
    /// Convert another rate limiter's configuration into gateway.toml (printed
    /// on stdout, to add to the configuration).
    #[command(subcommand)]
    Import(ImportFrom),
    /// Ask the running gateway's admin API (its address and token read
    /// from the configuration) and print the answer.
    #[command(subcommand)]
    Admin(AdminCommand),
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Empty one key's state of a limit (its next request starts afresh).
    Reset { limit: String, key: String },
    /// Per-key overrides of a limit's numbers.
    #[command(subcommand)]
    Overrides(OverridesCommand),
}

#[derive(Debug, Subcommand)]
enum OverridesCommand {
    /// Set the key's override: `--json BODY` or name=value pairs
    /// (`capacity=500 refill=50/s ttl=1h reason=trial`).
    Set {
        limit: String,
        key: String,
        /// The override as a JSON object.
        #[arg(long, value_name = "BODY")]
        json: Option<String>,
        #[arg(value_name = "NAME=VALUE")]
        params: Vec<String>,
    },
    /// List the limit's overrides.
    List { limit: String },
    /// Remove the key's override.
    Delete { limit: String, key: String },
    /// Delete the overrides a limit removed from the configuration left in
    /// Redis (once no node runs a configuration with it).
    Prune { limit: String },
}

#[derive(Debug, Subcommand)]
enum ImportFrom {
    /// envoyproxy/ratelimit's YAML files: their domains as `[limits.*]` and
    /// `[[decision.descriptors]]`, in the order given.
    EnvoyRatelimit {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["trace", "generate"])))]
struct SimulateArgs {
    /// A trace: CSV with a header row or JSON lines, gzip or not; `-` for stdin.
    #[arg(long, value_name = "FILE")]
    trace: Option<String>,
    /// Generated traffic: `boundary-burst`, `poisson:rate=R,keys=K,duration=D`,
    /// `page-loads:users=U,burst=8`; each client is one key of every kind the
    /// route's limits read, or of those `vary=KIND,...` lists (e.g.
    /// `vary=ip,header:x-api-key`).
    #[arg(long, value_name = "SPEC")]
    generate: Option<String>,
    /// Report this route only (and send generated traffic to it).
    #[arg(long, value_name = "NAME")]
    route: Option<String>,
    /// Run every rate limit under each of these algorithms, at the same long-run rate.
    #[arg(long, value_name = "ALGO,...", value_delimiter = ',')]
    compare: Vec<String>,
    /// Draw admitted and denied requests over time to this SVG file.
    #[arg(long, value_name = "OUT")]
    svg: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write each request's decision to this file, one JSON object a line.
    #[arg(long, value_name = "OUT")]
    decisions: Option<PathBuf>,
    /// A modelled upstream: `capacity=N,latency=DUR` (N served at once,
    /// exponential service times of mean DUR, the rest queued;
    /// `queue=Q`, `slo=DUR`, `seed=S` optional).
    #[arg(long, value_name = "SPEC")]
    backend: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `import` reads another program's files, not gateway.toml.
    let config = || {
        Config::load(&cli.config).map_err(|error| {
            eprintln!("{error}");
            ExitCode::FAILURE
        })
    };
    let outcome = match cli.command.unwrap_or(Command::Run) {
        Command::Check => config().map(|config| check(&config)),
        Command::Run => config().map(|config| run(config, cli.log_format)),
        Command::Simulate(args) => config().map(|config| simulate(&config, args)),
        Command::Import(from) => Ok(import(from)),
        Command::Admin(command) => config().map(|config| admin(&config, command)),
    };
    outcome.unwrap_or_else(|failed| failed)
}

fn check(config: &Config) -> ExitCode {
    print!("{}", tollgate::summary::render(config));
    for warning in tollgate::config::warnings::bypass_warnings(config) {
        eprintln!("warning: {warning}");
    }
    for warning in tollgate::config::warnings::store_warnings(config) {
        eprintln!("warning: {warning}");
    }
    let now = std::time::SystemTime::now();
    for warning in tollgate::config::warnings::expiry_warnings(config, now) {
        eprintln!("warning: {warning}");
    }
    ExitCode::SUCCESS
}

/// The converted configuration on stdout; or every problem on stderr, each
/// naming its file and line, and nothing on stdout.
fn import(from: ImportFrom) -> ExitCode {
    let ImportFrom::EnvoyRatelimit { files } = from;
    match tollgate::import::envoy_ratelimit::convert(&files) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(problems) => {
            for problem in problems {
                eprintln!("{problem}");
            }
            ExitCode::FAILURE
        }
    }
}

/// One admin API request; its answer's body on stdout, or on stderr with
/// exit code 1 when the API refuses (as the API gives it) or cannot be
/// reached.
fn admin(config: &Config, command: AdminCommand) -> ExitCode {
    use tollgate::admin::client::{Command as Admin, send};
    let command = match command {
        AdminCommand::Reset { limit, key } => Admin::Reset { limit, key },
        AdminCommand::Overrides(OverridesCommand::Set {
            limit,
            key,
            json,
            params,
        }) => Admin::OverridesSet {
            limit,
            key,
            json,
            params,
        },
        AdminCommand::Overrides(OverridesCommand::List { limit }) => Admin::OverridesList { limit },
        AdminCommand::Overrides(OverridesCommand::Delete { limit, key }) => {
            Admin::OverridesDelete { limit, key }
        }
        AdminCommand::Overrides(OverridesCommand::Prune { limit }) => {
            Admin::OverridesPrune { limit }
        }
    };
    let request = match command.request() {
        Ok(request) => request,
        Err(message) => {
            eprintln!("tollgate admin: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(send(config, &request)) {
        Ok(answer) if answer.is_success() => {
            println!("{}", answer.body.trim_end());
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            eprintln!("{}", answer.body.trim_end());
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("tollgate admin: {message}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(config: &Config, args: SimulateArgs) -> ExitCode {
    let options = tollgate::simulate::Options {
        trace: args.trace,
        generate: args.generate,
        route: args.route,
        compare: args.compare,
        svg: args.svg,
        json: args.json,
        decisions: args.decisions,
        backend: args.backend,
    };
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    match tollgate::simulate::simulate(config, &options, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate simulate: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn run(config: Config, log_format: LogFormat) -> ExitCode {
    // Fixed before anything sizes per-worker state (`App::new` included).
    let workers = tollgate::worker::init(config.server.workers);
    // The main thread's runtime is single-threaded whatever `workers` says:
    // with one worker it serves the traffic itself, without the work-stealing
    // scheduler's cross-thread bookkeeping; with more, each worker thread has
    // its own (see `conn`) and this one keeps signals, the admin listener
    // and reloads.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Signals first: a SIGHUP or SIGTERM sent as soon as the listening
        // lines appear must find its handler (the default action of both is
        // to kill the process).
        let signals = match Signals::install() {
            Ok(signals) => signals,
            Err(error) => {
                eprintln!("cannot install signal handlers: {error}");
                return ExitCode::FAILURE;
            }
        };
        let listeners = match Listeners::bind(&config).await {
            Ok(listeners) => listeners,
            Err(error) => {
                // The admin listener's bind error names its key; any other
                // is the traffic listener's.
                let message = error.to_string();
                let key: &[&str] = if message.contains("(server.admin)") {
                    &["server", "admin"]
                } else if message.contains("(decision.listen)") {
                    &["decision", "listen"]
                } else if message.contains("(server.tls.listen)") {
                    &["server", "tls", "listen"]
                } else {
                    &["server", "listen"]
                };
                eprintln!("{}", config.problem_at(key, message));
                return ExitCode::FAILURE;
            }
        };
        for url in listeners.traffic_urls().into_iter().flatten() {
            eprintln!("listening on {url}");
        }
        if let Ok(Some(address)) = listeners.admin_addr() {
            eprintln!("admin on http://{address}");
        }
        if let Ok(Some(address)) = listeners.decision_addr() {
            eprintln!("decisions on http://{address}");
        }
        init_logging(log_format);
        let path = config.path.clone();
        tollgate::fd_limit::raise_for(config.server.max_connections);
        let app = App::new(config);
        if let Err(error) = app.restore_overrides() {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
        for warning in tollgate::config::warnings::bypass_warnings(&app.snapshot().config) {
            tracing::warn!("{warning}");
        }
        for warning in tollgate::config::warnings::store_warnings(&app.snapshot().config) {
            tracing::warn!("{warning}");
        }
        let now = std::time::SystemTime::now();
        for warning in tollgate::config::warnings::expiry_warnings(&app.snapshot().config, now) {
            tracing::warn!("{warning}");
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(signals.dispatch(app.clone(), path, stop_tx));
        let shutdown = async {
            let _ = stop_rx.await;
        };
        match tollgate::run(listeners, app, shutdown).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("cannot start {workers} workers: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The process signals tollgate answers.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// SIGTERM/SIGINT start the drain; SIGHUP reloads the configuration.
    async fn dispatch(
        mut self,
        app: std::sync::Arc<App>,
        path: PathBuf,
        shutdown: oneshot::Sender<()>,
    ) {
        loop {
            tokio::select! {
                _ = self.terminate.recv() => break,
                _ = self.interrupt.recv() => break,
                _ = self.hangup.recv() => {
                    // Off the main thread's runtime, so a reload never stalls signals,
                    // the admin listener or (with `workers = 1`) requests.
                    // SIGHUPs arriving meanwhile coalesce into one more reload.
                    let (app, path) = (app.clone(), path.clone());
                    let _ = tokio::task::spawn_blocking(move || tollgate::reload::reload(&app, &path)).await;
                }
            }
        }
        tracing::info!("shutting down: draining connections");
        let _ = shutdown.send(());
    }
}
