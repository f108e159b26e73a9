//! Remote objects read from `safeload-testhttp`: as plain HTTP and as the hub, byte for
//! byte against the files, through every fault the server injects.

use std::time::{Duration, Instant};

use safeload_testhttp::{DEFAULT_COMMIT, Fault, FaultEvery, Options, Server, hex_sha256};

use super::{location, pattern, quick_tuning, settings, tree};
use crate::remote::error::RemoteErrorKind;
use crate::remote::store::Tuning;
use crate::source::Source;

const MIB: usize = 1 << 20;

fn serve(files: &[(&str, &[u8])], options: Options) -> (tempfile::TempDir, Server) {
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
    let (_dir, server) = serve(&[("m.safetensors", &data)], options);
    let base = server.url();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let object = http.open_file("m.safetensors").unwrap();
    assert!(object.ranges_ignored());
    assert_eq!(object.len(), 300_000);
    for i in 0..10 {
        let mut dst = vec![0; 20_000];
        object.read_at(&mut dst, 20_000, i * 25_000).unwrap();
        let at = (i * 25_000) as usize;
        assert!(dst == data[at..at + 20_000]);
    }
    let stats = server.stats();
    // The open's GET, answered whole and kept: every read is served from it.
    assert_eq!((stats.requests, stats.head_requests), (1, 0));
    assert_eq!(stats.bytes_sent, 300_000, "{stats:?}");
    assert_eq!(object.requests(), 1);
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
fn the_hub_token_goes_with_every_request_and_a_refusal_is_at_once() {
    let data = pattern(50_000, 12);
    let options = Options {
        token: Some("hf_RightToken".into()),
        ..Options::default()
    };
    let (_dir, server) = serve(&[("m.safetensors", &data)], options);
    let base = server.url();
    let with = |token: &str| settings(&base, &[("HF_TOKEN", token)], quick_tuning());

    let hub = location("hf://o/r", with("hf_RightToken"));
    let object = hub.open_file("m.safetensors").unwrap();
    let mut dst = vec![0; 40_000];
    object.read_at(&mut dst, 40_000, 10_000).unwrap();
    assert!(dst == data[10_000..]);
    assert_eq!(
        server.stats().refused,
        0,
        "the HEAD and both GETs carried it"
    );

    server.reset_stats();
    let wrong = location("hf://o/r", with("hf_WrongToken"));
    let e = wrong.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Denied);
    assert_eq!(server.stats().requests, 1, "a 403 is not retried");
    assert!(!format!("{e} {e:?}").contains("WrongToken"), "{e}");

    // Through the HTTP store too (no hub HEAD): 401 is an error at once.
    server.reset_stats();
    let http = location(&format!("{base}/"), settings(&base, &[], quick_tuning()));
    let e = http.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Denied, "{e}");
    assert_eq!(server.stats().requests, 1);
}

#[test]
fn the_hub_metadata_is_read_from_its_redirect_and_the_bytes_where_it_leads() {
    let data = pattern(300_000, 13);
    let options = Options {
        hub_redirect: true,
        token: Some("hf_tok3n".into()),
        ..Options::default()
    };
    let (_dir, server) = serve(&[("sub/m.safetensors", &data)], options);
    let base = server.url();
    let hub = location(
        "hf://o/r@main/sub",
        settings(&base, &[("HF_TOKEN", "hf_tok3n")], quick_tuning()),
    );
    let object = hub.open_file("m.safetensors").unwrap();
    assert_eq!(hub.commit().as_deref(), Some(DEFAULT_COMMIT));
    assert_eq!(
        object.hub().unwrap().sha256(),
        Some(hex_sha256(&data).as_str())
    );
    assert_eq!(object.hub().unwrap().size, Some(300_000));
    let mut dst = vec![0; 200_000];
    object.read_at(&mut dst, 200_000, 100_000).unwrap();
    assert!(dst == data[100_000..]);
    // The HEAD (answered 302, not followed), then each GET: a 302 and the ranged answer.
    let stats = server.stats();
    assert_eq!((stats.head_requests, stats.requests), (1, 5), "{stats:?}");
    assert_eq!(stats.bytes_sent, 4096 + 200_000);
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

#[test]
fn every_file_of_a_hub_load_is_read_at_the_commit_the_first_answer_named() {
    let a = pattern(100_000, 14);
    let b = pattern(100_000, 15);
    let files: [(&str, &[u8]); 2] = [("a.safetensors", &a), ("b.safetensors", &b)];
    for hub_redirect in [false, true] {
        let options = Options {
            hub_redirect,
            ..Options::default()
        };
        let (_dir, server) = serve(&files, options);
        let base = server.url();
        let hub = location("hf://o/r@main", settings(&base, &[], quick_tuning()));
        let first = hub.open_file("a.safetensors").unwrap();
        let second = hub.open_file("b.safetensors").unwrap();
        for (object, data) in [(&first, &a), (&second, &b)] {
            let mut dst = vec![0; 50_000];
            object.read_at(&mut dst, 50_000, 50_000).unwrap();
            assert!(dst == data[50_000..]);
        }
        // Only the first file's HEAD names the branch; everything after, the commit.
        assert_eq!(
            server.revision_requests("main"),
            1,
            "redirect: {hub_redirect}"
        );
        let at_commit = server.revision_requests(DEFAULT_COMMIT);
        assert_eq!(at_commit, 5, "redirect: {hub_redirect}");
    }
}

/// A port on loopback nothing listens on: bound, then let go.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_hub_that_cannot_be_reached_is_unreachable_and_one_that_refuses_says_why() {
    // Refused: asked twice, then unreachable.
    let base = format!("http://127.0.0.1:{}", dead_port());
    let hub = location("hf://o/r", settings(&base, &[], quick_tuning()));
    let e = hub.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Unreachable, "{e}");

    // No answer within the request's timeout, every try.
    let options = Options {
        latency: Some(Duration::from_secs(3)),
        ..Options::default()
    };
    let (_dir, slow) = serve(&[("m.safetensors", b"abc")], options);
    let tuning = Tuning {
        request_timeout: Duration::from_millis(200),
        max_retries: 1,
        ..quick_tuning()
    };
    let hub = location("hf://o/r", settings(&slow.url(), &[], tuning));
    let e = hub.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::Unreachable, "{e}");

    // A repository the hub does not have; a gated one, without a token and with another.
    let options = Options {
        repositories: Some(vec!["o/r".into()]),
        token: Some("hf_right".into()),
        gated: true,
        ..Options::default()
    };
    let (_dir, server) = serve(&[("m.safetensors", b"abc")], options);
    let base = server.url();
    let cases = [
        (
            "hf://o/other",
            Some("hf_right"),
            RemoteErrorKind::RepoNotFound,
        ),
        ("hf://o/r", Some("hf_wrong"), RemoteErrorKind::Gated),
        ("hf://o/r", None, RemoteErrorKind::Gated),
    ];
    for (url, token, kind) in cases {
        let vars: Vec<(&str, &str)> = token.map(|t| ("HF_TOKEN", t)).into_iter().collect();
        let hub = location(url, settings(&base, &vars, quick_tuning()));
        let e = hub.open_file("m.safetensors").unwrap_err();
        assert_eq!(e.kind, kind, "{url} {token:?}: {e}");
    }
    // Each a refusal at once, never retried.
    assert_eq!(server.stats().requests, 3);
}
