//! The remote benchmark's tables: every arm's medians (min-max) on each server, the
//! downloads part by part against the remote load, and each of issue 26's targets against
//! its median. Ratios are taken per round (the two arms of one round), then their median.

use std::fmt::Write as _;

use crate::common::proc;
use crate::common::stats::{Spread, gib_s, median};
use crate::{
    CACHE_COLD_TARGET, CACHE_WARM_TARGET, Figures, LIMIT_TARGET, Options, SHARD_SLACK, Sample,
    Summary,
};

/// The target on a remote load against the same reads into fresh memory (issue 35).
const FRESH_TARGET: f64 = 0.95;
/// The slowest round of a remote load over its median, at most (issue 35), unless the
/// fresh-memory arm's own spread is wider in the same run.
const TAIL_TARGET: f64 = 1.3;

/// The runs of one arm on one server that did not fail.
fn ok<'a>(samples: &'a [Sample], server: &str, arm: &str) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.server == server && s.arm == arm && s.error.is_none())
        .collect()
}

/// Per round, `f(a's run, b's run)`, where both ran without error.
fn per_round(
    samples: &[Sample],
    server: &str,
    (a, b): (&str, &str),
    f: impl Fn(&Sample, &Sample) -> f64,
) -> Vec<f64> {
    let bs = ok(samples, server, b);
    ok(samples, server, a)
        .into_iter()
        .filter_map(|x| {
            let y = bs.iter().find(|y| y.round == x.round)?;
            Some(f(x, y))
        })
        .collect()
}

/// The most requests any shard file took in a run.
fn most_per_file(s: &Sample) -> u64 {
    s.traffic.file_requests.iter().copied().max().unwrap_or(0)
}

fn spread(runs: &[&Sample], f: impl Fn(&Sample) -> f64) -> Spread {
    Spread::of(&runs.iter().map(|s| f(s)).collect::<Vec<_>>())
}

pub fn markdown(o: &Options, samples: &[Sample], served: &[Summary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} rounds, arms interleaved, each its own process; medians (min-max); ratios per round, then their median; {}\n",
        o.rounds,
        proc::machine()
    );
    for s in served {
        let _ = writeln!(
            out,
            "{}: {} files, {:.2} GiB{}\n",
            s.server,
            s.files,
            s.total as f64 / (1u64 << 30) as f64,
            match s.server {
                "testhttp" => format!(
                    "; {} ms per request, a {} MiB/s link shared by every connection",
                    o.latency_ms, o.link_mib_s
                ),
                _ => "; through a counting proxy".to_string(),
            }
        );
    }
    let _ = writeln!(
        out,
        "| server | arm | seconds | GiB/s sent | x limit | sent x checkpoint | requests | most per file | connections at once | server CPU s | sys s | peak RSS MiB |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for s in served {
        for arm in &s.arms {
            let runs = ok(samples, s.server, arm);
            let failed = samples
                .iter()
                .filter(|x| x.server == s.server && &x.arm == arm && x.error.is_some())
                .count();
            let failed = if failed > 0 {
                format!(" ({failed} failed)")
            } else {
                String::new()
            };
            if runs.is_empty() {
                let _ = writeln!(out, "| {} | {arm}{failed} | | | | | | | | | | |", s.server);
                continue;
            }
            let x_limit = if matches!(
                arm.as_str(),
                "safeload" | "safeload-http" | "limit" | "limit-fresh"
            ) {
                format!(
                    "{:.2}",
                    Spread::of(&per_round(samples, s.server, (arm, "limit"), |a, l| {
                        l.figures.seconds / a.figures.seconds
                    }))
                )
            } else {
                String::new()
            };
            let med =
                |f: &dyn Fn(&Sample) -> f64| median(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
            let _ = writeln!(
                out,
                "| {} | {arm}{failed} | {:.3} | {:.2} | {x_limit} | {:.3} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} |",
                s.server,
                spread(&runs, |r| r.figures.seconds),
                spread(&runs, |r| gib_s(r.traffic.bytes, r.figures.seconds)),
                spread(&runs, |r| r.traffic.bytes as f64 / s.total as f64),
                med(&|r| r.traffic.requests as f64),
                med(&|r| most_per_file(r) as f64),
                med(&|r| r.traffic.connections as f64),
                med(&|r| r.traffic.server_cpu),
                spread(&runs, |r| r.figures.sys_seconds),
                med(&|r| (r.figures.maxrss_kib >> 10) as f64),
            );
        }
    }

    // The downloads, part by part, against the remote load.
    let _ = writeln!(
        out,
        "\n| server | arm | download s | then load s | total s | total x remote load | cold load s | total (cold load) s | x remote load |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for s in served {
        for arm in s.arms.iter().filter(|a| a.contains("download")) {
            let runs = ok(samples, s.server, arm);
            let part = |f: fn(&Figures) -> Option<f64>| {
                spread(&runs, |r| f(&r.figures).unwrap_or(f64::NAN))
            };
            let cold_total = |f: &Figures| {
                f.download_seconds.unwrap_or(f64::NAN) + f.cold_load_seconds.unwrap_or(f64::NAN)
            };
            let vs = |total: &dyn Fn(&Figures) -> f64| {
                Spread::of(&per_round(samples, s.server, (arm, "safeload"), |d, r| {
                    total(&d.figures) / r.figures.seconds
                }))
            };
            let _ = writeln!(
                out,
                "| {} | {arm} | {:.3} | {:.3} | {:.3} | {:.2} | {:.3} | {:.3} | {:.2} |",
                s.server,
                part(|f| f.download_seconds),
                part(|f| f.load_seconds),
                spread(&runs, |r| r.figures.seconds),
                vs(&|f| f.seconds),
                part(|f| f.cold_load_seconds),
                spread(&runs, |r| cold_total(&r.figures)),
                vs(&cold_total),
            );
        }
    }

    let _ = writeln!(out, "\nTargets (medians):\n");
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    for s in served {
        let quoted = if s.server == "moto" {
            " (quoted, not judged: moto's speed is Python's)"
        } else {
            ""
        };
        let med = |v: Vec<f64>| median(&v);
        let limit = med(ok(samples, s.server, "limit")
            .iter()
            .map(|r| gib_s(r.traffic.bytes, r.figures.seconds))
            .collect());
        if limit.is_finite() && s.server == "testhttp" {
            let link = o.link_mib_s as f64 / 1024.0;
            let _ = writeln!(
                out,
                "- {}: the limit moved {limit:.3} GiB/s, {:.0}% of the {link:.3} GiB/s link",
                s.server,
                100.0 * limit / link
            );
        }
        for arm in ["safeload", "safeload-http"] {
            // Against the same reads into fresh memory: medians of the whole run (the
            // target's), and each arm's slowest round over its median.
            let seconds = |arm: &str| {
                Spread::of(
                    &ok(samples, s.server, arm)
                        .iter()
                        .map(|r| r.figures.seconds)
                        .collect::<Vec<_>>(),
                )
            };
            let (load, fresh) = (seconds(arm), seconds("limit-fresh"));
            if load.median.is_finite() && fresh.median.is_finite() {
                let x = fresh.median / load.median;
                let tail = load.max / load.median;
                let _ = writeln!(
                    out,
                    "- {}, {arm}: {x:.3}x the same reads into fresh memory (limit-fresh) >= {FRESH_TARGET}x {}; slowest round {tail:.2}x its median <= {TAIL_TARGET}x {} (limit-fresh {:.2}x){quoted}",
                    s.server,
                    verdict(x >= FRESH_TARGET),
                    verdict(tail <= TAIL_TARGET || tail <= fresh.max / fresh.median),
                    fresh.max / fresh.median,
                );
            }
            let x = med(per_round(samples, s.server, (arm, "limit"), |a, l| {
                l.figures.seconds / a.figures.seconds
            }));
            // The limit plus faulting in fresh memory for the checkpoint (the same round's).
            let with_memory = med(per_round(samples, s.server, (arm, "limit"), |a, l| {
                let fresh = ok(samples, s.server, "fresh-memory")
                    .into_iter()
                    .find(|f| f.round == a.round)
                    .map_or(f64::NAN, |f| f.figures.seconds);
                (l.figures.seconds + fresh) / a.figures.seconds
            }));
            if x.is_finite() {
                let _ = writeln!(
                    out,
                    "- {}, {arm}: {x:.3}x the limit >= {LIMIT_TARGET}x {}{quoted}; {with_memory:.3}x the limit plus fresh memory",
                    s.server,
                    verdict(x >= LIMIT_TARGET)
                );
            }
        }
        for (arm, remote) in [
            ("download-then-load", "safeload"),
            ("hub-download-then-load", "safeload"),
            ("download-then-load", "safeload-http"),
            ("hub-download-then-load", "safeload-http"),
        ] {
            let x = med(per_round(samples, s.server, (arm, remote), |d, r| {
                d.figures.seconds / r.figures.seconds
            }));
            let cold = med(per_round(samples, s.server, (arm, remote), |d, r| {
                (d.figures.download_seconds.unwrap_or(f64::NAN)
                    + d.figures.cold_load_seconds.unwrap_or(f64::NAN))
                    / r.figures.seconds
            }));
            if x.is_finite() {
                let _ = writeln!(
                    out,
                    "- {}, {arm} over the remote load ({remote}): {x:.2}x the time (> 1: the remote load is faster; with the load after the download cold: {cold:.2}x) {}{quoted}",
                    s.server,
                    verdict(x > 1.0)
                );
            }
        }
        let open = ok(samples, s.server, "open");
        if !open.is_empty() {
            let sent = med(open.iter().map(|r| r.traffic.bytes as f64).collect());
            let most = med(open.iter().map(|r| most_per_file(r) as f64).collect());
            let index = med(open
                .iter()
                .map(|r| r.traffic.index_requests as f64)
                .collect());
            let seconds = med(open.iter().map(|r| r.figures.seconds).collect());
            let shards = open.first().map_or(0, |r| r.traffic.file_requests.len());
            let serial = shards as f64 * o.latency_ms as f64 / 1000.0;
            let serial_note = if s.server == "testhttp" {
                format!(
                    "; {seconds:.3} s, {:.2}x {shards} x {} ms one file after another",
                    seconds / serial,
                    o.latency_ms
                )
            } else {
                format!("; {seconds:.3} s")
            };
            let _ = writeln!(
                out,
                "- {}, header-only open: {:.3} MiB sent < 1 MiB {}; at most {most:.0} requests per file <= 2 {} (and {index:.0} of the index){serial_note}{quoted}",
                s.server,
                sent / (1 << 20) as f64,
                verdict(sent < (1 << 20) as f64),
                verdict(most <= 2.0),
            );
        }
        // The hub cache (issue 34): the write-through against the same load with the cache
        // off, and a hit against a local load of the same files.
        for (arm, against, target, what) in [
            (
                "cache-cold",
                "safeload",
                CACHE_COLD_TARGET,
                "the cold load writing through to the hub cache",
            ),
            (
                "cache-warm",
                "local",
                CACHE_WARM_TARGET,
                "a hit of the hub cache",
            ),
        ] {
            let x = per_round(samples, s.server, (arm, against), |a, b| {
                b.figures.seconds / a.figures.seconds
            });
            if x.is_empty() {
                continue;
            }
            let spread = Spread::of(&x);
            let _ = writeln!(
                out,
                "- {}, {what} ({arm}): {spread:.3}x the speed of {against} >= {target}x {}",
                s.server,
                verdict(median(&x) >= target)
            );
        }
        let cold = ok(samples, s.server, "cache-cold");
        if !cold.is_empty() {
            let synced = med(cold
                .iter()
                .filter_map(|r| r.figures.writeback_seconds)
                .collect());
            let _ = writeln!(
                out,
                "- {}, cache-cold: the cache then synced in {synced:.3} s (the kernel's writeback, after the load returned)",
                s.server
            );
        }
        let warm = ok(samples, s.server, "cache-warm");
        if !warm.is_empty() {
            let requests = med(warm.iter().map(|r| r.traffic.requests as f64).collect());
            let _ = writeln!(
                out,
                "- {}, cache-warm: {requests:.0} request(s) to the hub <= 1 {}",
                s.server,
                verdict(requests <= 1.0)
            );
        }
        let shard = ok(samples, s.server, "shard");
        if !shard.is_empty() {
            let x = med(shard
                .iter()
                .map(|r| r.traffic.bytes as f64 / s.total as f64)
                .collect());
            let bound = SHARD_SLACK / o.world as f64;
            let _ = writeln!(
                out,
                "- {}, rank 0 of {}: {x:.4}x the checkpoint sent <= {bound:.4}x {}{quoted}",
                s.server,
                o.world,
                verdict(x <= bound)
            );
        }
    }
    out
}
