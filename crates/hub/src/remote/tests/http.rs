//! Remote objects read from `safeload-testhttp`: as plain HTTP and as the hub, byte for
//! byte against the files, through every fault the server injects.

use std::time::{Duration, Instant};

use safeload_testhttp::{DEFAULT_COMMIT, Fault, FaultEvery, Options, Server, hex_sha256};

use super::{location, pattern, quick_tuning, settings, tree};
use crate::remote::error::RemoteErrorKind;
use crate::remote::store::Tuning;
use crate::source::Source;

const MIB: usize = 1 << 20;

pub(super) fn serve(files: &[(&str, &[u8])], options: Options) -> (tempfile::TempDir, Server) {
    let dir = tree(files);
    let server = Server::start(dir.path(), options).unwrap();
    (dir, server)
}

/// Reads of many offsets and lengths, compared with the bytes of the file (the naive twin).
fn assert_reads_match(source: &dyn Source, data: &[u8]) {
    assert_eq!(source.len(), data.len() as u64);
    let len = data.len();
    let cases = [
        (0, 8),
        (0, 4096),
        (4000, 200),
        (4096, 1),
        (12_345, 100_000),
        (len / 2, len / 3),
        (len - 10, 10),
        (0, len),
    ];
    for (offset, n) in cases {
        let mut dst = vec![0; n];
        source.read_at(&mut dst, n, offset as u64).unwrap();
        assert!(dst == data[offset..offset + n], "{offset}+{n}");
    }
    // Past the end: what there is, and an error where more is required.
    let mut dst = vec![0; 100];
    source.read_at(&mut dst, 10, len as u64 - 10).unwrap();
    assert_eq!(&dst[..10], &data[len - 10..]);
    let (at, e) = source.read_at(&mut dst, 11, len as u64 - 10).unwrap_err();
    assert_eq!(at, len as u64 - 10);
    assert!(e.to_string().contains("required"), "{e}");
}

#[test]
fn http_and_hub_reads_are_byte_identical_to_the_files() {
    let data = pattern(3 * MIB + 17, 1);
    let (_dir, server) = serve(
        &[
            ("model.safetensors", &data),
            ("sub/b.safetensors", &data[..1000]),
        ],
        Options::default(),
    );
    let base = server.url();

    let http = location(
        &format!("{base}/model.safetensors"),
        settings(&base, &[], quick_tuning()),
    );
    assert_eq!(http.file(), Some("model.safetensors"));
    let object = http.open_file("model.safetensors").unwrap();
    assert_eq!(
        object.etag(),
        Some(format!("\"{}\"", hex_sha256(&data)).as_str())
    );
    assert_reads_match(&object, &data);

    let hub = location("hf://org/repo", settings(&base, &[], quick_tuning()));
    assert_eq!(hub.commit(), None, "no request before a file is opened");
    let object = hub.open_file("model.safetensors").unwrap();
    assert_eq!(hub.commit().as_deref(), Some(DEFAULT_COMMIT));
    let meta = object.hub().unwrap();
    assert_eq!(meta.sha256(), Some(hex_sha256(&data).as_str()));
    assert_eq!(
        object.path().to_str().unwrap(),
        format!("hf://org/repo@{DEFAULT_COMMIT}/model.safetensors")
    );
    assert_reads_match(&object, &data);

    let sub = location(
        "hf://org/repo@main/sub",
        settings(&base, &[], quick_tuning()),
    );
    let small = sub.open_file("b.safetensors").unwrap();
    let mut dst = vec![0; 1000];
    small.read_at(&mut dst, 1000, 0).unwrap();
    assert_eq!(dst, &data[..1000]);
}

#[test]
fn open_is_one_ranged_request_and_reads_in_its_prefix_are_free() {
    let data = pattern(100_000, 2);
    let (_dir, server) = serve(&[("m.safetensors", &data)], Options::default());
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let object = http.open_file("m.safetensors").unwrap();
    assert_eq!(server.stats().requests, 1);
    assert_eq!(object.requests(), 1);
    assert_eq!(server.stats().ranged_requests, 1);
    assert_eq!(server.path_stats("m.safetensors").bytes_sent, 4096);
    let mut header = vec![0; 4000];
    object.read_at(&mut header, 4000, 8).unwrap();
    assert_eq!(header, &data[8..4008]);
    assert_eq!(server.stats().requests, 1, "inside the prefix: no request");
    let mut rest = vec![0; 50_000];
    object.read_at(&mut rest, 50_000, 50_000).unwrap();
    assert_eq!(rest, &data[50_000..]);
    assert_eq!(server.stats().requests, 2);
    assert_eq!(
        server.stats().bytes_sent,
        4096 + 50_000,
        "exactly the bytes asked"
    );

    // The hub: a HEAD for its metadata, then the same one ranged GET.
    server.reset_stats();
    let hub = location("hf://o/r", settings(&base, &[], quick_tuning()));
    hub.open_file("m.safetensors").unwrap();
    let stats = server.stats();
    assert_eq!((stats.requests, stats.head_requests), (2, 1));
}

#[test]
fn every_fault_is_retried_from_the_exact_byte() {
    let data = pattern(4 * MIB, 3);
    for fault in [
        Fault::ServiceUnavailable,
        Fault::ResetMidBody,
        Fault::ShortBody,
    ] {
        let every = Some(FaultEvery { every: 2, fault });
        let options = Options {
            fault: every,
            ..Options::default()
        };
        let (_dir, server) = serve(&[("m.safetensors", &data)], options);
        let base = server.url();
        let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
        // Request 1, the open, is whole; request 2, the read's first, breaks.
        let object = http.open_file("m.safetensors").unwrap();
        let mut dst = vec![0; 3 * MIB];
        object.read_at(&mut dst, 3 * MIB, MIB as u64).unwrap();
        assert!(dst == data[MIB..], "{fault:?}");
        let stats = server.stats();
        assert_eq!(stats.faults, 1, "{fault:?}");
        assert_eq!(stats.requests, 3, "{fault:?}: one retry");
        // Resumed where it stopped: the broken half is not fetched again (a reset may lose
        // what was in flight, never more than the half sent).
        let read_bytes = stats.bytes_sent - 4096;
        let most = if fault == Fault::ResetMidBody {
            3 * MIB + 3 * MIB / 2
        } else {
            3 * MIB
        };
        assert!(read_bytes as usize <= most, "{fault:?}: {read_bytes}");
        assert!(read_bytes as usize >= 3 * MIB, "{fault:?}: {read_bytes}");
    }
}

#[test]
fn failures_past_the_retries_are_typed_errors_naming_the_url_and_range() {
    let data = pattern(100_000, 4);
    let every = Some(FaultEvery {
        every: 1,
        fault: Fault::ServiceUnavailable,
    });
    let (_dir, server) = serve(
        &[("m.safetensors", &data)],
        Options {
            fault: every,
            ..Options::default()
        },
    );
    let base = server.url();
    let http = location(
        &format!("{base}/m.safetensors"),
        settings(&base, &[], quick_tuning()),
    );
    let t0 = Instant::now();
    let e = http.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Failed);
    assert_eq!(e.range, Some(0..4096));
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "failed to read {base}/m.safetensors (bytes 0..4096)"
        )),
        "{text}"
    );
    // The GET and its 3 retries, then a HEAD and its 3 (which cannot tell an empty object).
    assert_eq!(server.stats().requests, 8);
    assert!(t0.elapsed() < Duration::from_secs(5));

    // A read: every second request fails, no retry allowed.
    let every = Some(FaultEvery {
        every: 2,
        fault: Fault::ServiceUnavailable,
    });
    let (_dir, server) = serve(
        &[("m.safetensors", &data)],
        Options {
            fault: every,
            ..Options::default()
        },
    );
    let base = server.url();
    let tuning = Tuning {
        max_retries: 0,
        ..quick_tuning()
    };
    let http = location(&format!("{base}/"), settings(&base, &[], tuning));
    let object = http.open_file("m.safetensors").unwrap();
    let mut dst = vec![0; 1000];
    let (at, e) = object.read_at(&mut dst, 1000, 50_000).unwrap_err();
    assert_eq!(at, 50_000);
    let text = e.to_string();
    assert!(text.contains("(bytes 50000..51000)"), "{text}");
    assert!(text.contains("503"), "{text}");
}

#[test]
fn missing_objects_fail_at_once() {
    let (_dir, server) = serve(&[("m.safetensors", b"x")], Options::default());
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let e = http.open_file("missing.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::NotFound);
    assert_eq!(server.stats().requests, 1, "a 404 is not retried");

    let hub = location(
        "hf://o/r@v9",
        settings(&base, &[("HF_TOKEN", "hf_SeCrEtToKeN")], quick_tuning()),
    );
    let e = hub.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::RevisionNotFound, "{e}");
    assert!(
        e.to_string()
            .starts_with("no such revision: hf://o/r@v9/m.safetensors"),
        "{e}"
    );
    assert!(!format!("{e} {e:?}").contains("SeCrEt"));
    assert_eq!(server.stats().requests, 2);
}

#[test]
fn a_replaced_object_is_an_error_never_a_mix() {
    let data = pattern(200_000, 5);
    let (_dir, server) = serve(&[("m.safetensors", &data)], Options::default());
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let object = http.open_file("m.safetensors").unwrap();
    server.replace("m.safetensors", pattern(200_000, 6));
    let mut dst = vec![0; 100_000];
    let (_, e) = object.read_at(&mut dst, 100_000, 100_000).unwrap_err();
    assert!(e.to_string().contains("changed since it was opened"), "{e}");
    // Inside the prefix read at open, the opened version is still served.
    let mut head = vec![0; 100];
    object.read_at(&mut head, 100, 0).unwrap();
    assert_eq!(head, &data[..100]);
    // A new open sees the new version.
    let again = http.open_file("m.safetensors").unwrap();
    assert_ne!(again.etag(), object.etag());
}

#[test]
fn a_server_ignoring_range_is_read_once_for_every_read() {
    let data = pattern(300_000, 7);
    let options = Options {
        ignore_range: true,
        ..Options::default()
    };
    let (_dir, server) = serve(
        &[("m.safetensors", &data), ("small.json", &data[..3000])],
        options,
    );
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let object = http.open_file("m.safetensors").unwrap();
    assert!(object.ranges_ignored());
    assert_eq!(object.len(), 300_000);
    // The open keeps what it asked for, not the 300,000 bytes it was answered with.
    assert_eq!(object.kept_prefix(), 4096);
    for i in 0..10 {
        let mut dst = vec![0; 20_000];
        object.read_at(&mut dst, 20_000, i * 25_000).unwrap();
        let at = (i * 25_000) as usize;
        assert!(dst == data[at..at + 20_000]);
    }
    let stats = server.stats();
    // The open's GET, cut after its range (the server sent what the connection took
    // before it was dropped), then one whole GET: every read is served from it.
    assert_eq!((stats.requests, stats.head_requests), (2, 0));
    assert!(
        (300_000 + 4096..=600_000).contains(&stats.bytes_sent),
        "{stats:?}"
    );
    assert_eq!(object.requests(), 2);
    // An object no longer than the open's range is kept whole by the open: one request.
    server.reset_stats();
    let small = http.open_file("small.json").unwrap();
    assert!(small.ranges_ignored());
    assert_eq!(small.read_small(1 << 20).unwrap(), &data[..3000]);
    assert_eq!(server.stats().requests, 1);
    assert_eq!(small.requests(), 1);
}

#[test]
fn a_whole_answer_to_the_open_is_held_no_further_than_the_range() {
    // A claim of a terabyte, met with zeros for as long as the client reads.
    let data = pattern(300_000, 9);
    let options = Options {
        ignore_range: true,
        claimed_len: Some(1 << 40),
        ..Options::default()
    };
    let (_dir, server) = serve(&[("m.safetensors", &data)], options);
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let t0 = Instant::now();
    let e = http.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Protocol, "{e}");
    assert!(
        e.detail.contains("ignores Range") && e.detail.contains("1099511627776 bytes"),
        "{e}"
    );
    assert!(e.detail.contains("may take in memory"), "{e}");
    // Refused at once: its connection dropped after the range, one request in all.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    std::thread::sleep(Duration::from_millis(200));
    let stats = server.stats();
    assert_eq!(stats.requests, 1, "{stats:?}");
    assert!(stats.bytes_sent < 64 << 20, "{stats:?}");
}

#[test]
fn a_small_read_is_refused_past_its_callers_limit_before_a_byte_moves() {
    let data = pattern(100_000, 10);
    for ignore_range in [false, true] {
        let options = Options {
            ignore_range,
            ..Options::default()
        };
        let (_dir, server) = serve(&[("index.json", &data)], options);
        let base = server.url();
        let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
        let object = http.open_file("index.json").unwrap();
        server.reset_stats();
        let e = object.read_small(99_999).unwrap_err();
        assert!(
            e.detail.contains("100000 bytes, more than the 99999"),
            "{e}"
        );
        assert_eq!(server.stats().requests, 0, "{ignore_range}");
        // At the limit: read, whole, byte for byte.
        assert_eq!(object.read_small(100_000).unwrap(), data, "{ignore_range}");
        assert_eq!(server.stats().requests, 1, "{ignore_range}");
    }
}

#[test]
fn a_read_across_the_opens_bytes_fetches_only_the_rest() {
    let data = pattern(100_000, 11);
    let (_dir, server) = serve(&[("m.safetensors", &data)], Options::default());
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let object = http.open_file("m.safetensors").unwrap();
    server.reset_stats();
    let landed = std::sync::Mutex::new(Vec::new());
    let land = |at: u64, bytes: &[u8]| landed.lock().unwrap().push((at, bytes.to_vec()));
    let mut dst = vec![0; 60_000];
    object.read(&mut dst, 60_000, 1000, Some(&land)).unwrap();
    assert!(dst == data[1000..61_000]);
    // The open's 4096 bytes copied: only the rest crossed the network.
    assert_eq!(server.stats().bytes_sent, 61_000 - 4096);
    // Every byte handed on once, in order.
    let landed = landed.into_inner().unwrap();
    let mut at = 1000;
    for (offset, bytes) in &landed {
        assert_eq!(*offset, at);
        at += bytes.len() as u64;
    }
    assert_eq!(at, 61_000);
    assert_eq!(landed[0].1.len(), 4096 - 1000, "the kept part first");
}

#[test]
fn a_stalled_request_times_out_within_its_bound() {
    let options = Options {
        latency: Some(Duration::from_secs(3)),
        ..Options::default()
    };
    let (_dir, server) = serve(&[("m.safetensors", b"abc")], options);
    let base = server.url();
    let tuning = Tuning {
        request_timeout: Duration::from_millis(200),
        max_retries: 1,
        ..quick_tuning()
    };
    let http = location(&format!("{base}/"), settings(&base, &[], tuning));
    let t0 = Instant::now();
    let e = http.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Failed);
    // Two attempts of the GET and two of the HEAD, 200 ms each, and backoffs.
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn reads_from_many_threads_share_one_object() {
    let data = pattern(2 * MIB, 8);
    let options = Options {
        latency: Some(Duration::from_millis(5)),
        ..Options::default()
    };
    let (_dir, server) = serve(&[("m.safetensors", &data)], options);
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let object = http.open_file("m.safetensors").unwrap();
    let chunk = 128 * 1024;
    std::thread::scope(|s| {
        for t in 0..4 {
            let (object, data) = (&object, &data);
            s.spawn(move || {
                for i in (t..data.len() / chunk).step_by(4) {
                    let mut dst = vec![0; chunk];
                    object.read_at(&mut dst, chunk, (i * chunk) as u64).unwrap();
                    assert!(dst == data[i * chunk..(i + 1) * chunk], "chunk {i}");
                }
            });
        }
    });
    assert!(
        server.stats().max_open_connections >= 2,
        "{:?}",
        server.stats()
    );
}

#[test]
fn small_and_empty_objects_open_and_read() {
    let (_dir, server) = serve(
        &[("small.safetensors", b"abc"), ("empty.safetensors", b"")],
        Options::default(),
    );
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let small = http.open_file("small.safetensors").unwrap();
    assert_eq!(small.len(), 3);
    let mut dst = [0; 8];
    small.read_at(&mut dst, 3, 0).unwrap();
    assert_eq!(&dst[..3], b"abc");
    assert_eq!(server.stats().requests, 1, "the open's prefix holds it all");
    // An empty object answers the open's range with 416; a HEAD then tells its length.
    let empty = http.open_file("empty.safetensors").unwrap();
    assert_eq!(empty.len(), 0);
    empty.read_at(&mut dst, 0, 0).unwrap();
    assert!(empty.read_at(&mut dst, 1, 0).is_err());
}
