//! The scripts and what travels to them: `stack.lua` (decisions),
//! `settle.lua` (settlements, refunds, concurrency renewals and releases)
//! and `heartbeat.lua`, their keys and arguments encoded, and their answers
//! parsed.
//!
//! Both decision and settlement scripts are loaded once with `SCRIPT LOAD`
//! when a connection is made, and again when a call finds them gone
//! (`NOSCRIPT`, after a `SCRIPT FLUSH` or a restart). A settlement's
//! arguments are text ([`eval_cmd`]); a batch of decisions sends each
//! distinct key once and everything else as one msgpack argument
//! ([`batch_cmd`], `msgpack`): the scripts' headers have the layouts.

use std::fmt::Write as _;
use std::sync::LazyLock;

use redis::{Cmd, Value};
use smallvec::SmallVec;

use super::{LEASE, RedisStore, SharedEntry, msgpack};
use crate::limit::{Algorithm, LeakyMode, Nanos, Verdict, WindowAlign, quota};

/// `stack.lua` with `calendar.lua` spliced in at [`CALENDAR_AT`], in the
/// branch that decides a calendar window: its function is a closure, an
/// allocation each time a call runs its definition, so only a call that
/// decides a calendar month makes it (prepended, every call did).
pub(super) static STACK_LUA: LazyLock<String> = LazyLock::new(|| {
    include_str!("stack.lua").replacen(CALENDAR_AT, include_str!("calendar.lua"), 1)
});
/// The line of `stack.lua` that `calendar.lua` replaces.
const CALENDAR_AT: &str = "      -- [calendar.lua]\n";
pub(super) const SETTLE_LUA: &str =
    concat!(include_str!("calendar.lua"), include_str!("settle.lua"));
pub(super) const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

/// The numbers of one decision's entries (2 or 4 per entry, see
/// `stack.lua`).
pub(super) type Answer = SmallVec<[i64; 16]>;

/// Per entry of a decision, its verdict and the units it took.
pub(super) type Verdicts = SmallVec<[(Verdict, u64); 4]>;

/// The script arguments of one decision or settlement: its keys, then its
/// ARGV values. Keys and text values share one buffer (a request builds no
/// `String` per value); numbers stay numbers until the command is written:
/// as text for `settle.lua` ([`eval_cmd`]), as msgpack numbers for a batch
/// of `stack.lua` ([`batch_cmd`]), never formatted and parsed back.
#[derive(Debug, Default)]
pub(super) struct Args {
    /// The keys, then the text values, one after the other.
    text: String,
    /// Where each key ends in `text`.
    key_ends: SmallVec<[u32; 4]>,
    /// The ARGV values; inline room for a decision of two entries (8 and
    /// 15 values for one and two).
    values: SmallVec<[Param; 16]>,
}

/// An ARGV value of [`Args`].
#[derive(Debug, Clone, Copy)]
enum Param {
    Int(i64),
    /// An emission interval in picoseconds, which the scripts take in µs
    /// (see [`interval_micros`]).
    Interval(u128),
    /// Text: this range of [`Args::text`] (a lease member).
    Text(u32, u32),
}

/// A [`Param`] with its text resolved: what two decisions' parameter sets
/// are compared by.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ParamValue<'a> {
    Int(i64),
    Interval(u128),
    Text(&'a str),
}

/// An interval of `ps` picoseconds as the scripts read it in text: µs with
/// six decimals.
fn interval_text(ps: u128) -> String {
    format!("{}.{:06}", ps / 1_000_000, ps % 1_000_000)
}

/// An interval of `ps` picoseconds as µs: the double Lua's `tonumber`
/// (`strtod`, correctly rounded) makes of [`interval_text`]. Below 2^53
/// `ps` is an exact double and one IEEE division is correctly rounded too,
/// so the two agree; above, through the text.
fn interval_micros(ps: u128) -> f64 {
    if ps < 1 << 53 {
        ps as f64 / 1e6
    } else {
        interval_text(ps).parse().unwrap_or(f64::MAX)
    }
}

impl Args {
    /// Ends the key written at the end of [`Args::text`] since the last.
    fn end_key(&mut self) {
        self.key_ends
            .push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
    }

    pub(super) fn keys(&self) -> usize {
        self.key_ends.len()
    }

    /// Key `i`.
    pub(super) fn key(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.key_ends[i - 1] };
        &self.text[start as usize..self.key_ends[i] as usize]
    }

    /// An integer value; one past `i64` as `i64::MAX` (a limit no count
    /// reaches either way).
    fn int<E>(&mut self, value: impl TryInto<i64, Error = E>) {
        self.values
            .push(Param::Int(value.try_into().unwrap_or(i64::MAX)));
    }

    fn text_value(&mut self, value: &str) {
        let start = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        self.text.push_str(value);
        let end = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        self.values.push(Param::Text(start, end));
    }

    /// ARGV value `i`.
    fn value(&self, i: usize) -> ParamValue<'_> {
        match self.values[i] {
            Param::Int(v) => ParamValue::Int(v),
            Param::Interval(ps) => ParamValue::Interval(ps),
            Param::Text(a, b) => ParamValue::Text(&self.text[a as usize..b as usize]),
        }
    }
}

/// `EVALSHA <hash> <keys> <keys…> <argv…>` of `args`, each value in text
/// (`settle.lua`).
fn eval_cmd(hash: &str, args: &Args) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(hash).arg(args.keys());
    for i in 0..args.keys() {
        cmd.arg(args.key(i));
    }
    for i in 0..args.values.len() {
        match args.value(i) {
            ParamValue::Int(v) => cmd.arg(v),
            ParamValue::Interval(ps) => cmd.arg(interval_text(ps)),
            ParamValue::Text(text) => cmd.arg(text),
        };
    }
    cmd
}

/// Values per entry of a decision's [`Args`] after its entry count:
/// algorithm, p1–p4, shadow (a parameter set of `stack.lua`), cost.
const ENTRY_VALUES: usize = 7;

/// The most values a batch sends as a stream of msgpack values rather than
/// as one array: Lua lets a C function return at most 8,000 (`LUAI_MAXCSTACK`).
const STREAM_MAX: usize = 4_000;

/// One `stack.lua` call deciding `batch` in order (the script's header has
/// the layout): the batch's distinct keys, those of windows and buckets
/// first (the script reads them with one `MGET`), then in msgpack its
/// distinct parameter sets (each sent once), the number of window
/// and bucket keys, and the decisions as key-and-set numbers and costs.
/// Each argument costs Redis about what a `GET` does and each `tonumber`
/// a `strtod`, so a batch sends one argument per distinct key and one
/// msgpack argument for everything else, its numbers as msgpack numbers.
pub(super) fn batch_cmd<'a>(hash: &str, batch: impl Iterator<Item = &'a Args> + Clone) -> Cmd {
    let entries: usize = batch.clone().map(Args::keys).sum();
    // Distinct keys in first-seen order, with whether their state is a
    // string (window or bucket: algorithms 1, 2 and 4).
    let mut keys: Vec<(&str, bool)> = Vec::with_capacity(entries);
    let mut seen: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(entries);
    let mut sets: SmallVec<[[ParamValue<'_>; ENTRY_VALUES - 1]; 4]> = SmallVec::new();
    // Per entry: its key's and its set's indexes, and its cost.
    let mut list: Vec<(usize, usize, i64)> = Vec::with_capacity(entries);
    for args in batch.clone() {
        for j in 0..args.keys() {
            let base = 1 + j * ENTRY_VALUES;
            let set: [ParamValue<'_>; ENTRY_VALUES - 1] =
                std::array::from_fn(|v| args.value(base + v));
            let key = args.key(j);
            let k = *seen.entry(key).or_insert_with(|| {
                let string_state = matches!(set[0], ParamValue::Int(1 | 2 | 4));
                keys.push((key, string_state));
                keys.len() - 1
            });
            let s = sets.iter().position(|s| *s == set).unwrap_or_else(|| {
                sets.push(set);
                sets.len() - 1
            });
            let cost = match args.value(base + ENTRY_VALUES - 1) {
                ParamValue::Int(cost) => cost,
                _ => i64::MAX,
            };
            list.push((k, s, cost));
        }
    }
    // Key numbers (from 0): string-state keys first, each group in order.
    let mut number = vec![0_i64; keys.len()];
    let mut next = 0;
    for string_state in [true, false] {
        for (k, _) in keys
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| *s == string_state)
        {
            number[k] = next;
            next += 1;
        }
    }
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(hash).arg(keys.len());
    for string_state in [true, false] {
        for (key, _) in keys.iter().filter(|(_, s)| *s == string_state) {
            cmd.arg(*key);
        }
    }
    // A decision of one entry is that entry; of n others, -n and them.
    let np = sets.len() as i64;
    let decisions: usize = batch
        .clone()
        .map(|a| if a.keys() == 1 { 2 } else { 1 + 2 * a.keys() })
        .sum();
    let values = 2 + sets.len() * (ENTRY_VALUES - 1) + decisions;
    let mut packed = Vec::with_capacity(5 + values * 5);
    // The values one after the other, which `cmsgpack.unpack` returns as
    // they are and the script gathers with one `{ … }`: building the table
    // element by element, as for an array, cost Redis as much as the rest
    // of a one-decision call's parsing. Past what a Lua C call may return,
    // one array.
    if values > STREAM_MAX {
        msgpack::array(&mut packed, values);
    }
    msgpack::int(&mut packed, np);
    for set in &sets {
        for value in set {
            param(&mut packed, *value);
        }
    }
    let string_keys = keys.iter().filter(|(_, s)| *s).count();
    msgpack::int(&mut packed, string_keys as i64);
    let mut list = list.iter();
    for args in batch {
        if args.keys() != 1 {
            msgpack::int(&mut packed, -(args.keys() as i64));
        }
        for &(k, s, cost) in list.by_ref().take(args.keys()) {
            msgpack::int(&mut packed, number[k] * np + s as i64 + 1);
            msgpack::int(&mut packed, cost);
        }
    }
    cmd.arg(packed);
    cmd
}

/// A parameter in msgpack: an integer, an interval as the float64 of its
/// µs (the number `settle.lua` reads from its text), a string (a lease
/// member).
fn param(out: &mut Vec<u8>, value: ParamValue<'_>) {
    match value {
        ParamValue::Int(v) => msgpack::int(out, v),
        ParamValue::Interval(ps) => msgpack::float(out, interval_micros(ps)),
        ParamValue::Text(text) => msgpack::string(out, text),
    }
}

impl RedisStore {
    /// `EVALSHA <script> n keys… argv…` for `entries` (`settle.lua`).
    pub(super) fn script_cmd(
        &self,
        script: &redis::Script,
        entries: &[SharedEntry<'_>],
        amount: impl Fn(usize) -> i64,
        member: Option<&str>,
    ) -> Cmd {
        eval_cmd(script.get_hash(), &self.args(entries, amount, member))
    }

    /// The keys of `entries`, then their number and 7 values each: a
    /// settlement as `settle.lua` takes it, or one decision, which
    /// [`batch_cmd`] lays out for `stack.lua`.
    pub(super) fn args(
        &self,
        entries: &[SharedEntry<'_>],
        amount: impl Fn(usize) -> i64,
        member: Option<&str>,
    ) -> Args {
        let mut args = Args {
            text: String::with_capacity(entries.len() * 96),
            ..Args::default()
        };
        for e in entries {
            self.write_key(e, &mut args.text);
            args.end_key();
        }
        args.int(entries.len());
        for (i, e) in entries.iter().enumerate() {
            push_params(e, member.unwrap_or(""), &mut args);
            args.int(i64::from(e.shadow));
            args.int(amount(i));
        }
        args
    }

    /// `<prefix><limit>:{<digest>}:<algorithm>[:<plan>]`.
    pub(super) fn key_of(&self, e: &SharedEntry<'_>) -> String {
        let mut key = String::with_capacity(self.config.prefix.len() + e.limit.len() + 48);
        self.write_key(e, &mut key);
        key
    }

    /// [`RedisStore::key_of`], written at the end of `key`.
    fn write_key(&self, e: &SharedEntry<'_>, key: &mut String) {
        let tag = match e.algorithm {
            Algorithm::FixedWindow { .. } => "fw",
            Algorithm::SlidingWindow { .. } => "sw",
            Algorithm::SlidingLog { .. } => "sl",
            Algorithm::TokenBucket { .. } => "tb",
            Algorithm::LeakyBucket { .. } => "lb",
            Algorithm::Concurrency { .. } => "cc",
            // Never shared (config keeps it node-local); named apart anyway.
            Algorithm::Adaptive { .. } => "ad",
        };
        let _ = write!(
            key,
            "{}{}:{{{:032x}}}:{tag}",
            self.config.prefix,
            e.limit,
            e.key.as_u128()
        );
        if let Some(plan) = e.plan {
            key.push(':');
            key.push_str(plan);
        }
    }
}

/// The five per-entry script parameters (see `stack.lua`), times in µs,
/// pushed onto `args`.
fn push_params(e: &SharedEntry<'_>, member: &str, args: &mut Args) {
    let us = |n: Nanos| (n / 1_000).max(1);
    // The emission interval T = per / tokens, counted in ps and rounded,
    // in integers: the scripts take it in µs with six decimals.
    let interval = |args: &mut Args, per: Nanos, tokens: u64| {
        let tokens = u128::from(tokens.max(1));
        let ps = (u128::from(per) * 1_000 + tokens / 2) / tokens;
        args.values.push(Param::Interval(ps));
    };
    match e.algorithm {
        Algorithm::FixedWindow { limit, window } => {
            // p4: 0 epoch-aligned, 1 first_request, 2 calendar months.
            let (jitter, first) = match e.align {
                WindowAlign::Epoch { jitter } | WindowAlign::Month { jitter } if jitter > 0 => {
                    // As in memory: the digest's high half picks the offset.
                    let hi = (e.key.as_u128() >> 64) as u64;
                    let month = matches!(e.align, WindowAlign::Month { .. });
                    ((hi % jitter) / 1_000, if month { 2 } else { 0 })
                }
                WindowAlign::Epoch { .. } => (0, 0),
                WindowAlign::FirstRequest => (0, 1),
                WindowAlign::Month { .. } => (0, 2),
            };
            args.int(1);
            args.int(limit);
            args.int(us(window));
            args.int(jitter);
            args.int(first);
        }
        Algorithm::SlidingWindow { limit, window } | Algorithm::SlidingLog { limit, window } => {
            let code = if matches!(e.algorithm, Algorithm::SlidingWindow { .. }) {
                2
            } else {
                3
            };
            args.int(code);
            args.int(limit);
            args.int(us(window));
            args.int(0);
            args.int(0);
        }
        Algorithm::TokenBucket {
            capacity,
            refill,
            wait,
        } => {
            args.int(4);
            args.int(capacity);
            interval(args, refill.per, refill.tokens);
            // `wait` as a negative p3 (µs), apart from the leaky flag.
            args.int(-i64::try_from(wait / 1_000).unwrap_or(i64::MAX));
            args.int(e.lease.min(capacity));
        }
        Algorithm::LeakyBucket {
            capacity,
            rate,
            mode,
        } => {
            args.int(4);
            args.int(capacity.saturating_add(1));
            interval(args, rate.per, rate.tokens);
            args.int(u8::from(mode == LeakyMode::Delay));
            args.int(0);
        }
        Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. } => {
            // An adaptive limit is node-local (`config::limits` sets
            // `local`): it never reaches the store. Were it to, its `max`
            // as a static concurrency bound is the safe reading.
            debug_assert!(matches!(e.algorithm, Algorithm::Concurrency { .. }));
            args.int(5);
            args.int(quota(&e.algorithm));
            args.int(LEASE.as_millis());
            args.text_value(member);
            args.int(0);
        }
    }
}

/// One decision's answer from `items`: per entry of its `entries`, 2
/// integers, or 4 when the first has its `more` bit (see `stack.lua`);
/// `None` when they are not integers or run out.
pub(super) fn take_answer<'v>(
    items: &mut impl Iterator<Item = &'v Value>,
    entries: usize,
) -> Option<Answer> {
    let mut next = || match items.next() {
        Some(Value::Int(i)) => Some(*i),
        _ => None,
    };
    let mut answer = Answer::new();
    for _ in 0..entries {
        let head = next()?;
        answer.push(head);
        answer.push(next()?);
        if head & 2 != 0 {
            answer.push(next()?);
            answer.push(next()?);
        }
    }
    Some(answer)
}

/// An answer (see `stack.lua`) into verdicts and the units taken, one per
/// entry of the given costs; `None` unless it is exactly that.
pub(super) fn parse_verdicts(answer: &[i64], costs: impl Iterator<Item = u64>) -> Option<Verdicts> {
    let ns = |us: i64| u64::try_from(us).unwrap_or(0).saturating_mul(1_000);
    let mut at = answer.iter().copied();
    let mut verdicts = Verdicts::new();
    for cost in costs {
        let head = at.next()?;
        let reset = at.next()?;
        let allowed = head & 1 == 1;
        // Without `more`: no retry or delay, and the cost taken if admitted.
        let (third, taken) = if head & 2 != 0 {
            (at.next()?, u64::try_from(at.next()?).unwrap_or(0))
        } else {
            (0, if allowed { cost } else { 0 })
        };
        let remaining = u64::try_from(head >> 2).unwrap_or(0);
        let verdict = if allowed {
            Verdict {
                delay: ns(third),
                ..Verdict::allow(remaining, ns(reset))
            }
        } else {
            Verdict::deny(remaining, ns(reset), ns(third), third < 0)
        };
        verdicts.push((verdict, taken));
    }
    at.next().is_none().then_some(verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{LimitKey, NANOS_PER_SEC, Rate};

    #[test]
    fn the_calendar_is_spliced_into_the_calendar_branch_once() {
        let stack = include_str!("stack.lua");
        assert_eq!(stack.matches(CALENDAR_AT).count(), 1);
        assert!(!STACK_LUA.contains(CALENDAR_AT));
        assert_eq!(STACK_LUA.matches("local function month_of(us)").count(), 1);
        // Inside `fixed`'s calendar branch, before its one use.
        let defined = STACK_LUA.find("local function month_of(us)").unwrap();
        let branch = STACK_LUA.find("elseif first == 2 then").unwrap();
        let used = STACK_LUA.find("= month_of(kn)").unwrap();
        assert!(branch < defined && defined < used);
    }

    #[test]
    fn verdicts_parse_two_or_four_integers_per_entry() {
        // Admitted, 4 left, cost taken; denied with a retry (more); admitted
        // with a lease of 7 (more).
        let answer = Value::Array(
            [4 * 4 + 1, 2_000, 2, 9_000, 3_000, 0, 3 * 4 + 3, 1_000, 0, 7]
                .into_iter()
                .map(Value::Int)
                .collect(),
        );
        let Value::Array(items) = &answer else {
            unreachable!()
        };
        let taken = take_answer(&mut items.iter(), 3).expect("three entries");
        assert_eq!(taken.len(), 10);
        let parsed = parse_verdicts(&taken, [5, 2, 1].into_iter()).expect("parses");
        assert_eq!(parsed[0], (Verdict::allow(4, 2_000_000), 5));
        assert_eq!(
            parsed[1],
            (Verdict::deny(0, 9_000_000, 3_000_000, false), 0)
        );
        assert_eq!(parsed[2], (Verdict::allow(3, 1_000_000), 7));
        assert!(
            parse_verdicts(&taken, [1, 1].into_iter()).is_none(),
            "an answer longer than its entries is refused"
        );
        assert!(
            parse_verdicts(&taken, [1, 1, 1, 1].into_iter()).is_none(),
            "a short answer is refused"
        );
        assert!(
            take_answer(&mut items.iter(), 4).is_none(),
            "an answer that runs out is refused"
        );
        let odd = [Value::Int(1), Value::Nil];
        assert!(
            take_answer(&mut odd.iter(), 1).is_none(),
            "a non-integer is refused"
        );
        let never = [2, 0, -1, 0];
        assert!(
            parse_verdicts(&never, [1].into_iter()).expect("parses")[0]
                .0
                .never
        );
    }

    /// The values `push_params` gives `e`, in the text `settle.lua` gets.
    fn params(e: &SharedEntry<'_>) -> Vec<String> {
        let mut args = Args::default();
        push_params(e, "", &mut args);
        (0..args.values.len())
            .map(|i| match args.value(i) {
                ParamValue::Int(v) => v.to_string(),
                ParamValue::Interval(ps) => interval_text(ps),
                ParamValue::Text(text) => text.to_owned(),
            })
            .collect()
    }

    #[test]
    fn script_parameters_are_microseconds_and_exact_intervals() {
        let e = SharedEntry {
            limit: "l",
            plan: None,
            algorithm: Algorithm::TokenBucket {
                capacity: 20,
                refill: Rate {
                    tokens: 3,
                    per: NANOS_PER_SEC,
                },
                wait: 0,
            },
            align: WindowAlign::default(),
            key: LimitKey::from_u128(7),
            shadow: false,
            lease: 100,
            cost: 1,
            remember: false,
        };
        // T = 1 s / 3; a lease is capped at the capacity.
        assert_eq!(params(&e), ["4", "20", "333333.333333", "0", "20"]);
        // 2 s / 3 = 666666.666666… µs: rounded to the nearest ps.
        let two_thirds = SharedEntry {
            algorithm: Algorithm::TokenBucket {
                capacity: 20,
                refill: Rate {
                    tokens: 3,
                    per: 2 * NANOS_PER_SEC,
                },
                wait: 0,
            },
            ..e
        };
        assert_eq!(params(&two_thirds)[2], "666666.666667");
        let e = SharedEntry {
            algorithm: Algorithm::FixedWindow {
                limit: 5,
                window: 60 * NANOS_PER_SEC,
            },
            align: WindowAlign::FirstRequest,
            ..e
        };
        assert_eq!(params(&e), ["1", "5", "60000000", "0", "1"]);
    }

    /// A decision's [`Args`]: its keys, then its entries' sets and costs,
    /// each value as its text spells it (an interval has a decimal point).
    fn decision(entries: &[(&str, [&str; 6], i64)]) -> Args {
        let mut args = Args::default();
        for (key, _, _) in entries {
            args.text.push_str(key);
            args.end_key();
        }
        args.int(entries.len());
        for (_, set, cost) in entries {
            for value in set {
                if let Some((us, frac)) = value.split_once('.') {
                    let ps = us.parse::<u128>().unwrap_or(0) * 1_000_000
                        + frac.parse::<u128>().unwrap_or(0);
                    args.values.push(Param::Interval(ps));
                } else if let Ok(v) = value.parse::<i64>() {
                    args.int(v);
                } else {
                    args.text_value(value);
                }
            }
            args.int(*cost);
        }
        args
    }

    fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_batch_sends_distinct_keys_sets_once_and_packed_decisions() {
        let bucket = ["4", "10", "1000.000000", "0", "0", "0"];
        let window = ["1", "5", "60000000", "0", "0", "0"];
        let lease = ["5", "3", "30000", "m1", "0", "0"];
        let a = decision(&[("kc", lease, 1), ("kb", bucket, 1)]);
        let b = decision(&[("kw", window, 300)]);
        let c = decision(&[("kb", bucket, 2)]);
        let cmd = batch_cmd("sha", [&a, &b, &c].into_iter());
        let mut expected: Vec<Vec<u8>> = ["EVALSHA", "sha", "3", "kb", "kw", "kc"]
            .iter()
            .map(|w| w.as_bytes().to_vec())
            .collect();
        // 2 + 3 sets * 6 + 9 = 29 msgpack values: 3 sets, each set's
        // values as numbers (the interval a float64, the member a string),
        // two string keys (kb, kw), then the decisions. Key numbers: kb 0,
        // kw 1, kc 2; sets: lease 0, bucket 1, window 2; e = key * 3 + set + 1.
        let mut packed = vec![3];
        packed.extend([5, 3, 0xcd, 0x75, 0x30, 0xa2, b'm', b'1', 0, 0]);
        packed.extend([4, 10, 0xcb]);
        packed.extend(1000.0_f64.to_bits().to_be_bytes());
        packed.extend([0, 0, 0]);
        packed.extend([1, 5, 0xce]);
        packed.extend(60_000_000_u32.to_be_bytes());
        packed.extend([0, 0, 0]);
        packed.extend([
            2,    // string keys
            0xfe, // -2 entries,
            7,    // kc, lease
            1, 2, // kb, bucket
            1, 6, // one entry: kw, window, cost 300 as uint16
            0xcd, 1, 44, 2, // one entry: kb, bucket
            2,
        ]);
        expected.push(packed);
        assert_eq!(words(&cmd), expected);
    }

    #[test]
    fn a_batch_too_long_for_a_lua_stack_is_one_array() {
        let bucket = ["4", "10", "1000.000000", "0", "0", "0"];
        let keys: Vec<String> = (0..2_000).map(|i| format!("k{i}")).collect();
        let entries: Vec<(&str, [&str; 6], i64)> =
            keys.iter().map(|k| (k.as_str(), bucket, 1)).collect();
        let big = decision(&entries);
        let cmd = batch_cmd("sha", std::iter::once(&big));
        let packed = words(&cmd).pop().unwrap_or_default();
        // 2 + 6 + 1 + 2 * 2,000 values: an array16 of 4,009.
        assert_eq!(packed[..3], [0xdc, 0x0f, 0xa9]);
        let small = decision(&entries[..10]);
        let packed = words(&batch_cmd("sha", std::iter::once(&small)))
            .pop()
            .unwrap_or_default();
        assert_eq!(packed[0], 1, "a stream, its first value the set count");
    }

    #[test]
    fn parameters_travel_as_the_numbers_the_scripts_read() {
        let packed = |value: ParamValue<'_>| {
            let mut out = Vec::new();
            param(&mut out, value);
            out
        };
        assert_eq!(packed(ParamValue::Int(12)), [12]);
        assert_eq!(packed(ParamValue::Int(-1)), [0xff]);
        let mut half = vec![0xcb];
        half.extend(0.5_f64.to_bits().to_be_bytes());
        assert_eq!(packed(ParamValue::Interval(500_000)), half);
        assert_eq!(
            packed(ParamValue::Text("node-1:7")),
            [0xa8, b'n', b'o', b'd', b'e', b'-', b'1', b':', b'7']
        );
        let long = "m".repeat(40);
        assert_eq!(&packed(ParamValue::Text(&long))[..2], [0xd9, 40]);
        // An interval is the double strtod makes of its text, which
        // settle.lua reads: the same bucket in both scripts. Thirds,
        // sevenths and a day per token (past 2^53 ps) included.
        let day = 86_400 * 1_000_000_000_000_u128;
        for ps in [
            1,
            333_333_333,
            666_666_667,
            142_857_143,
            1 << 53,
            day,
            day / 7 + 1,
        ]
        .into_iter()
        .chain((0..2_000).map(|i| 1_000_003 * i * i + 7 * i))
        .chain((0..200).map(|i| (1 << 53) - 100 + i * 999_999_937))
        {
            let text: f64 = interval_text(ps).parse().expect("a number");
            assert_eq!(interval_micros(ps).to_bits(), text.to_bits(), "{ps} ps");
        }
    }
}
