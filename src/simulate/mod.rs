//! `tollgate simulate`: what a `gateway.toml` would have done to a trace of
//! requests, before it is deployed.
//!
//! The trace ([`trace`]: a CSV or JSON-lines file, gzip or not, or stdin) or
//! a generated workload ([`generate`], its clients made by [`clients`]) is
//! run through the configuration on
//! a virtual clock ([`run`]): every record is routed by the gateway's
//! [`Router`](crate::routing::Router), its caller and keys found by the
//! gateway's identity functions, and its route's stack decided by the
//! gateway's [`check_stack`](crate::limit::check_stack) on limiters built by
//! the gateway's [`App`](crate::app::App) — the same code as `tollgate run`,
//! with the record's time as `now`. Nothing sleeps, nothing is sent. A
//! token limit is charged the reservation the gateway computes for the
//! record's body and settled at once on the record's `tokens` (see [`run`]).
//!
//! Each decision is also judged against the exact rule: an exact sliding log
//! of the limit's window form (`L` per `W`, [`compare`]) holding the same
//! admissions ([`tracker`]). A limit's false allows are the requests it
//! admitted although `L` units were already admitted for the key in the
//! last `W`; its false denies, those it denied although they fit (a free
//! unit counted once, however many requests find it). Judging
//! against the limit's own history, rather than a second run that drifts
//! away from it after the first disagreement, keeps the share meaningful
//! on overloaded traffic. `--compare` runs variants of the configuration,
//! each with every rate limit turned into one algorithm at the same long-run
//! rate, all on the same pass over the trace.
//!
//! With `--backend capacity=N,latency=DUR` each variant also has a modelled
//! upstream ([`backend`]) that its admitted requests are sent to, holding
//! their concurrency permits until their modelled responses end
//! ([`flight`]), so `concurrency` limits decide on what is really in
//! flight and the report adds goodput, shed requests and admitted latency.
//! A slot limit's `queue` is not modelled: the request it would hold is
//! counted refused at once, and the run says so ([`unmodelled_queues`]).
//!
//! [`report`] prints the table (or `--json`), [`svg`] draws the picture.
//!
//! `simulate` sits at the top of the layer order, beside `main` and the admin
//! listener: it imports the engine layers, nothing imports it.

pub(crate) mod backend;
pub(crate) mod clients;
pub(crate) mod compare;
pub(crate) mod flight;
pub(crate) mod generate;
pub(crate) mod goodput;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod svg;
pub(crate) mod text;
pub(crate) mod trace;
pub(crate) mod tracker;

use std::io::Write;
use std::path::PathBuf;

use crate::config::Config;

/// The command line of `tollgate simulate`, parsed.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A trace file, or `-` for stdin.
    pub trace: Option<String>,
    /// A generator spec such as `poisson:rate=50/s,keys=10,duration=1m`
    /// (`vary=ip,header:x-api-key` to choose the key kinds that vary).
    pub generate: Option<String>,
    /// Report this route only (and aim generated traffic at it).
    pub route: Option<String>,
    /// Algorithms to compare; empty: the configuration as written.
    pub compare: Vec<String>,
    /// Write the chart here.
    pub svg: Option<PathBuf>,
    /// Print JSON instead of the table.
    pub json: bool,
    /// Write every request's decision here, one JSON object a line.
    pub decisions: Option<PathBuf>,
    /// A modelled upstream, `capacity=N,latency=DUR[,queue=Q][,slo=DUR][,seed=S]`.
    pub backend: Option<String>,
}

/// Why a simulation could not run. [`Error::exit_code`] maps it: 2 for a
/// command line that asks for something that does not exist, 1 for a
/// failure to read or write.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad argument: unknown route or algorithm, a bad generator spec.
    #[error("{0}")]
    Usage(String),
    /// A trace that cannot be read, an output that cannot be written.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Failed(_) => 1,
        }
    }
}

/// Runs the simulation `options` describe against `config`: the table (or
/// JSON) to `out`, bad trace records and notes to `err`.
pub fn simulate(
    config: &Config,
    options: &Options,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), Error> {
    let algorithms = compare::parse_list(&options.compare)?;
    compare::check_applies(config, &algorithms)?;
    let focus = run::focus_route(config, options.route.as_deref())?;
    let given = options
        .backend
        .as_deref()
        .map(backend::Spec::parse)
        .transpose()?;
    let mut modelled = given.map(|g| (g, backend::Schedule::constant(g.capacity)));
    let (records, generated): (Box<dyn Iterator<Item = trace::Item>>, _) =
        match (&options.trace, &options.generate) {
            (Some(source), None) => (Box::new(trace::open(source)?), None),
            (None, Some(spec)) => {
                let spec = generate::Spec::parse(spec)?.inherit(given.as_ref());
                modelled = spec.backend(given);
                let (records, generated) = generate::records(&spec, config, focus)?;
                (Box::new(records), Some(generated))
            }
            _ => {
                return Err(Error::Usage(
                    "simulate needs one of --trace FILE or --generate SPEC".into(),
                ));
            }
        };
    let mut decisions = match &options.decisions {
        None => None,
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| Error::Failed(format!("cannot write {}: {e}", path.display())))?,
        )),
    };
    if modelled.is_some() {
        for name in unmodelled_queues(config) {
            writeln!(
                err,
                "limit `{name}`: its queue is not modelled; a request it would hold is counted refused at once"
            )
            .map_err(|e| Error::Failed(format!("cannot write: {e}")))?;
        }
    }
    let mut simulation = run::Simulation::new(config, &algorithms, focus);
    if let Some((spec, schedule)) = modelled {
        simulation = simulation.with_backend(spec, schedule);
    }
    let outcome = simulation.run(
        records,
        err,
        decisions.as_mut().map(|w| w as &mut dyn Write),
    );
    if let Some(mut writer) = decisions {
        writer
            .flush()
            .map_err(|e| Error::Failed(format!("cannot write the decisions: {e}")))?;
    }
    outcome?;
    let report = report::Report::new(&simulation, options.route.as_deref(), generated);
    let written = if options.json {
        report.write_json(out)
    } else {
        report.write_table(out)
    };
    written.map_err(|e| Error::Failed(format!("cannot write the report: {e}")))?;
    if let Some(path) = &options.svg {
        let text = svg::render(&simulation)?;
        std::fs::write(path, text)
            .map_err(|e| Error::Failed(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

/// The limits with a waiting line (`queue = {...}`), by name: the run
/// decides a request once, so one such a limit would hold is counted as
/// refused (an upper bound on its shedding, a lower one on its latency).
/// Only `--backend` makes a slot limit refuse at all.
fn unmodelled_queues(config: &Config) -> impl Iterator<Item = &str> {
    config
        .limits
        .iter()
        .filter(|limit| limit.queue.is_some())
        .map(|limit| limit.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::from_bytes(std::path::Path::new("gateway.toml"), text.as_bytes()).unwrap()
    }

    #[test]
    fn a_limit_with_a_queue_is_named_as_not_modelled() {
        let text = |queue: &str| {
            format!(
                "[limits.backend]\nkey = \"route\"\nalgorithm = \"concurrency\"\nmax = 5\n{queue}\n\
                 [limits.per_ip]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 9\nwindow = \"1m\"\n\
                 [[routes]]\nname = \"api\"\nmatch = {{ path_prefix = \"/\" }}\n\
                 respond = {{ status = 200 }}\nlimits = [\"backend\", \"per_ip\"]\n"
            )
        };
        let queued = parse(&text("queue = { max_wait = \"200ms\" }"));
        assert_eq!(unmodelled_queues(&queued).collect::<Vec<_>>(), ["backend"]);
        let plain = parse(&text(""));
        assert_eq!(unmodelled_queues(&plain).count(), 0);
    }
}
