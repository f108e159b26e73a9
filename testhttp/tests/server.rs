//! The test server as a client sees it: routes, ranges, ETags, conditional requests, the
//! knobs and every fault, through a plain `TcpStream`.

mod common;
use common::{Head, read_head, start, tree, write_request};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use safeload_testhttp::{
    DEFAULT_COMMIT, Fault, FaultEvery, Options, Replacement, Server, hex_sha256,
};

/// An answer as read off the wire: its head (`answer.status`, `answer.header(..)`) and body.
#[derive(Debug)]
struct Answer {
    head: Head,
    body: Vec<u8>,
    /// Whether the body was cut short of its `Content-Length` (closed or reset).
    cut: bool,
}

impl std::ops::Deref for Answer {
    type Target = Head;

    fn deref(&self) -> &Head {
        &self.head
    }
}

/// Sends one request on `stream` and reads its answer (`HEAD` answers have no body).
fn exchange(stream: &mut TcpStream, method: &str, target: &str, headers: &[&str]) -> Answer {
    write_request(stream, method, target, headers);
    let head = read_head(stream);
    let len = head.content_length() as usize;
    let mut answer = Answer {
        head,
        body: Vec::new(),
        cut: false,
    };
    if method == "HEAD" {
        return answer;
    }
    let mut body = vec![0; len];
    let mut got = 0;
    while got < len {
        match stream.read(&mut body[got..]) {
            Ok(0) | Err(_) => {
                answer.cut = true;
                break;
            }
            Ok(n) => got += n,
        }
    }
    body.truncate(got);
    answer.body = body;
    answer
}

fn get(server: &Server, target: &str, headers: &[&str]) -> Answer {
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    exchange(&mut stream, "GET", target, headers)
}

#[test]
fn hub_and_static_routes_serve_ranges_with_etags() {
    let (dir, data) = tree(100_000);
    let server = start(dir.path(), Options::default());
    let sha = hex_sha256(&data);
    let hub = "/org/repo/resolve/main/model.safetensors";

    let whole = get(&server, hub, &[]);
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body, data);
    assert_eq!(whole.header("etag"), Some(format!("\"{sha}\"").as_str()));
    assert_eq!(whole.header("x-repo-commit"), Some(DEFAULT_COMMIT));
    assert_eq!(
        whole.header("x-linked-etag"),
        Some(format!("\"{sha}\"").as_str())
    );
    assert_eq!(whole.header("x-linked-size"), Some("100000"));

    let part = get(&server, hub, &["Range: bytes=10-19"]);
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-range"), Some("bytes 10-19/100000"));
    assert_eq!(part.body, &data[10..20]);
    let tail = get(&server, "/model.safetensors", &["Range: bytes=-5"]);
    assert_eq!((tail.status, &tail.body[..]), (206, &data[99_995..]));
    assert_eq!(
        tail.header("x-repo-commit"),
        None,
        "the static route is no hub"
    );
    let clamped = get(
        &server,
        "/model.safetensors",
        &["Range: bytes=99990-200000"],
    );
    assert_eq!(clamped.body, &data[99_990..]);

    let past = get(&server, hub, &["Range: bytes=100000-"]);
    assert_eq!(past.status, 416);
    assert_eq!(past.header("content-range"), Some("bytes */100000"));

    let at_commit = format!("/org/repo/resolve/{DEFAULT_COMMIT}/sub/small.bin");
    assert_eq!(get(&server, &at_commit, &[]).body, b"hello");
    assert_eq!(
        get(&server, "/o/r/resolve/v2/sub/small.bin", &[]).status,
        404
    );
    assert_eq!(server.revision_requests("v2"), 1);
    assert_eq!(server.revision_requests(DEFAULT_COMMIT), 1);
    assert_eq!(server.revision_requests("main"), 3);
    assert_eq!(get(&server, "/missing", &[]).status, 404);
    assert_eq!(get(&server, "/../etc/passwd", &[]).status, 404);

    let mut stream = TcpStream::connect(server.addr()).unwrap();
    let head = exchange(&mut stream, "HEAD", hub, &["Range: bytes=0-7"]);
    assert_eq!(head.status, 206);
    assert_eq!(head.header("content-length"), Some("8"));
    // The same connection goes on (keep-alive) after a HEAD.
    let again = exchange(&mut stream, "GET", "/sub/small.bin", &[]);
    assert_eq!(again.body, b"hello");

    let stats = server.stats();
    assert_eq!(stats.head_requests, 1);
    assert!(stats.ranged_requests >= 5, "{stats:?}");
    let model = server.path_stats("model.safetensors");
    assert_eq!(model.bytes_sent, 100_000 + 10 + 5 + 10);
    assert_eq!(server.path_stats("sub/small.bin").bytes_sent, 10);
}

#[test]
fn if_match_answers_412_on_another_etag() {
    let (dir, data) = tree(1000);
    let server = start(dir.path(), Options::default());
    let etag = format!("\"{}\"", hex_sha256(&data));
    let ok = get(
        &server,
        "/model.safetensors",
        &["Range: bytes=0-9", &format!("If-Match: {etag}")],
    );
    assert_eq!(ok.status, 206);
    let bad = get(&server, "/model.safetensors", &["If-Match: \"other\""]);
    assert_eq!(bad.status, 412);
    assert!(bad.body.is_empty());
}

#[test]
fn every_nth_request_answers_503() {
    let (dir, _) = tree(1000);
    let fault = Some(FaultEvery {
        every: 3,
        fault: Fault::ServiceUnavailable,
    });
    let server = start(
        dir.path(),
        Options {
            fault,
            ..Options::default()
        },
    );
    let statuses: Vec<u16> = (0..6)
        .map(|_| get(&server, "/sub/small.bin", &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 503, 200, 200, 503]);
    assert_eq!(server.stats().faults, 2);
}

#[test]
fn body_faults_send_half_the_body_then_cut_the_connection() {
    for fault in [Fault::ResetMidBody, Fault::ShortBody] {
        let (dir, data) = tree(200_000);
        let fault_every = Some(FaultEvery { every: 2, fault });
        let server = start(
            dir.path(),
            Options {
                fault: fault_every,
                ..Options::default()
            },
        );
        let first = get(&server, "/model.safetensors", &["Range: bytes=1000-"]);
        assert!(!first.cut);
        assert_eq!(first.body, &data[1000..]);
        let second = get(&server, "/model.safetensors", &["Range: bytes=1000-"]);
        assert_eq!(second.status, 206, "{fault:?}");
        assert!(second.cut, "{fault:?}");
        // A client may lose the tail of what was sent to a reset; never more than was sent.
        assert!(second.body.len() <= 99_500, "{fault:?}");
        assert_eq!(second.body, &data[1000..1000 + second.body.len()]);
        if fault == Fault::ShortBody {
            assert_eq!(second.body.len(), 99_500);
        }
    }
}

#[test]
fn ignored_ranges_answer_the_whole_object() {
    let (dir, data) = tree(5000);
    let server = start(
        dir.path(),
        Options {
            ignore_range: true,
            ..Options::default()
        },
    );
    let answer = get(&server, "/model.safetensors", &["Range: bytes=0-9"]);
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-range"), None);
    assert_eq!(answer.body, data);
}

/// A client that hangs up part way through a body: the server's total and the object's own
/// count of bytes sent agree, and both stop short of the whole body.
#[test]
fn counters_agree_for_an_answer_the_client_hung_up_on() {
    let len = 32 << 20;
    let (dir, _) = tree(len);
    let server = start(
        dir.path(),
        Options {
            bandwidth_bytes_per_sec: Some(16 << 20),
            ..Options::default()
        },
    );
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    let request = "GET /model.safetensors HTTP/1.1\r\nHost: test\r\n\r\n";
    stream.write_all(request.as_bytes()).unwrap();
    let mut some = vec![0; 256 << 10];
    stream.read_exact(&mut some).unwrap();
    drop(stream);
    // The server stops at its next write to the closed connection.
    let mut last = u64::MAX;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        thread::sleep(Duration::from_millis(200));
        let sent = server.stats().bytes_sent;
        if sent == last || Instant::now() > deadline {
            break;
        }
        last = sent;
    }
    let (total, object) = (
        server.stats().bytes_sent,
        server.path_stats("model.safetensors"),
    );
    assert_eq!(object.requests, 1);
    assert_eq!(object.bytes_sent, total, "per path and in total");
    assert!(total >= 256 << 10 && total < len as u64, "{total} of {len}");
}

#[test]
fn a_replaced_object_gets_another_etag_after_its_delay() {
    let (dir, data) = tree(1000);
    let server = start(
        dir.path(),
        Options {
            replace_after: Some(Replacement {
                path: "model.safetensors".into(),
                after: Duration::from_millis(300),
                contents: b"new".to_vec(),
            }),
            ..Options::default()
        },
    );
    let before = get(&server, "/model.safetensors", &[]);
    assert_eq!(before.body, data);
    let old_etag = before.header("etag").unwrap().to_owned();
    thread::sleep(
        (server.started() + Duration::from_millis(350)).saturating_duration_since(Instant::now()),
    );
    let after = get(&server, "/model.safetensors", &[]);
    assert_eq!(after.body, b"new");
    assert_ne!(after.header("etag").unwrap(), old_etag);
    let conditional = get(
        &server,
        "/model.safetensors",
        &[&format!("If-Match: {old_etag}")],
    );
    assert_eq!(conditional.status, 412);

    server.replace("sub/small.bin", b"bye".to_vec());
    assert_eq!(get(&server, "/sub/small.bin", &[]).body, b"bye");
}

#[test]
fn latency_and_the_shared_link_pace_answers() {
    let (dir, _) = tree(2 << 20);
    let server = start(
        dir.path(),
        Options {
            latency: Some(Duration::from_millis(100)),
            bandwidth_bytes_per_sec: Some(8 << 20),
            ..Options::default()
        },
    );
    let t0 = Instant::now();
    // Two clients at once, 1 MiB each: the link carries both in 250 ms, after the latency.
    let clients: Vec<_> = [0, 1]
        .map(|i| {
            let addr = server.addr();
            thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                let range = format!("Range: bytes={}-{}", i << 20, ((i + 1) << 20) - 1);
                exchange(&mut stream, "GET", "/model.safetensors", &[&range])
                    .body
                    .len()
            })
        })
        .into();
    for c in clients {
        assert_eq!(c.join().unwrap(), 1 << 20);
    }
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(350), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(server.stats().bytes_sent, 2 << 20);
}

#[test]
fn connections_beyond_the_limit_wait_their_turn() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            latency: Some(Duration::from_millis(100)),
            max_connections: 2,
            ..Options::default()
        },
    );
    let t0 = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let addr = server.addr();
            thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                let answer = exchange(&mut stream, "GET", "/sub/small.bin", &["Connection: close"]);
                answer.status
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), 200);
    }
    // Four 100 ms answers two at a time: two rounds.
    assert!(
        t0.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t0.elapsed()
    );
    let stats = server.stats();
    assert_eq!(stats.max_open_connections, 2);
    assert_eq!(stats.connections, 4);
}

#[test]
fn drop_stops_promptly_with_idle_connections_open() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            idle_timeout: Duration::from_secs(30),
            ..Options::default()
        },
    );
    let addr = server.addr();
    let mut idle = TcpStream::connect(addr).unwrap();
    assert_eq!(
        exchange(&mut idle, "GET", "/sub/small.bin", &[]).status,
        200
    );
    let t0 = Instant::now();
    drop(server);
    // Within a few polls of 50 ms; the bound leaves room for a loaded CI machine.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The kept-alive connection was closed by the server.
    idle.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut byte = [0; 1];
    assert!(matches!(idle.read(&mut byte), Ok(0) | Err(_)));
}

#[test]
fn bad_requests_are_refused_without_harm() {
    let (dir, _) = tree(10);
    let server = start(dir.path(), Options::default());
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream.write_all(b"NONSENSE\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    let answer = exchange(&mut stream, "DELETE", "/sub/small.bin", &[]);
    assert_eq!(answer.status, 405);
    // Still serving.
    assert_eq!(get(&server, "/sub/small.bin", &[]).body, b"hello");
}

#[test]
fn a_token_is_required_where_one_is_set() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            token: Some("hf_test".into()),
            ..Options::default()
        },
    );
    let target = "/o/r/resolve/main/sub/small.bin";
    assert_eq!(get(&server, target, &[]).status, 401);
    assert_eq!(
        get(&server, target, &["Authorization: Bearer hf_other"]).status,
        403
    );
    let ok = get(&server, target, &["Authorization: Bearer hf_test"]);
    assert_eq!((ok.status, &ok.body[..]), (200, &b"hello"[..]));
    assert_eq!(server.stats().refused, 2);
}

#[test]
fn a_gated_repository_names_itself_in_its_refusals() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            token: Some("hf_test".into()),
            gated: true,
            ..Options::default()
        },
    );
    let target = "/o/r/resolve/main/sub/small.bin";
    for (headers, status) in [
        (&[][..], 401),
        (&["Authorization: Bearer hf_other"][..], 403),
    ] {
        let refused = get(&server, target, headers);
        assert_eq!(refused.status, status);
        assert_eq!(refused.header("x-error-code"), Some("GatedRepo"));
    }
    let ok = get(&server, target, &["Authorization: Bearer hf_test"]);
    assert_eq!((ok.status, ok.header("x-error-code")), (200, None));
}

#[test]
fn only_the_repositories_named_exist_where_some_are() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            repositories: Some(vec!["org/model".into()]),
            ..Options::default()
        },
    );
    let ok = get(&server, "/org/model/resolve/main/sub/small.bin", &[]);
    assert_eq!((ok.status, &ok.body[..]), (200, &b"hello"[..]));
    for target in [
        "/org/other/resolve/main/sub/small.bin",
        "/api/models/org/other/revision/main",
    ] {
        let missing = get(&server, target, &[]);
        assert_eq!(missing.status, 404, "{target}");
        assert_eq!(missing.header("x-error-code"), Some("RepoNotFound"));
    }
    let api = get(&server, "/api/models/org/model/revision/main", &[]);
    assert_eq!(api.status, 200);
    // The static route has no repositories.
    assert_eq!(get(&server, "/sub/small.bin", &[]).status, 200);
}

#[test]
fn the_hub_route_can_redirect_like_the_hub_for_lfs_files() {
    let (dir, data) = tree(1000);
    let server = start(
        dir.path(),
        Options {
            hub_redirect: true,
            ..Options::default()
        },
    );
    let answer = get(&server, "/o/r/resolve/main/model.safetensors", &[]);
    assert_eq!(answer.status, 302);
    // Absolute, to another host, as the hub's redirect to its CDN.
    assert_eq!(
        answer.header("location"),
        Some("http://test/model.safetensors")
    );
    assert_eq!(answer.header("x-repo-commit"), Some(DEFAULT_COMMIT));
    assert_eq!(answer.header("x-linked-size"), Some("1000"));
    let sha = format!("\"{}\"", hex_sha256(&data));
    assert_eq!(answer.header("x-linked-etag"), Some(sha.as_str()));
    assert!(answer.body.is_empty());
    assert_eq!(get(&server, "/model.safetensors", &[]).body, data);
}

#[test]
fn the_hub_route_answers_missing_files_and_small_files_as_the_hub_does() {
    let (dir, _) = tree(1000);
    std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
    let server = start(dir.path(), Options::default());
    // A file the revision lacks: the commit, and which thing is missing.
    let missing = get(&server, "/o/r/resolve/main/nothing.bin", &[]);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.header("x-repo-commit"), Some(DEFAULT_COMMIT));
    assert_eq!(missing.header("x-error-code"), Some("EntryNotFound"));
    let revision = get(&server, "/o/r/resolve/other/model.safetensors", &[]);
    assert_eq!(revision.status, 404);
    assert_eq!(revision.header("x-error-code"), Some("RevisionNotFound"));
    // A small file kept in git: its git blob id for ETag, no LFS metadata.
    let small = get(&server, "/o/r/resolve/main/config.json", &[]);
    assert_eq!((small.status, &small.body[..]), (200, &b"{}"[..]));
    // `printf '{}' | git hash-object --stdin`.
    let oid = "\"9e26dfeeb6e641a33dae4961196235bdb965b21b\"";
    assert_eq!(small.header("etag"), Some(oid));
    assert_eq!(small.header("x-linked-etag"), None);
    let again = get(
        &server,
        "/o/r/resolve/main/config.json",
        &[&format!("If-Match: {oid}")],
    );
    assert_eq!(again.status, 200);
}

#[test]
fn the_hub_api_lists_a_revision_and_its_tree() {
    let (dir, data) = tree(1000);
    let server = start(dir.path(), Options::default());
    let info = get(&server, "/api/models/o/r/revision/main", &[]);
    assert_eq!(info.status, 200);
    let info: serde_json::Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(info["sha"], DEFAULT_COMMIT);
    assert_eq!(info["id"], "o/r");
    let names: Vec<&str> = info["siblings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["rfilename"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["model.safetensors", "sub/small.bin"]);
    let tree = get(&server, "/api/models/o/r/tree/main?recursive=True", &[]);
    let tree: serde_json::Value = serde_json::from_slice(&tree.body).unwrap();
    let model = &tree.as_array().unwrap()[0];
    assert_eq!(model["path"], "model.safetensors");
    assert_eq!(model["size"], 1000);
    assert_eq!(model["lfs"]["oid"], hex_sha256(&data));
    let unknown = get(&server, "/api/models/o/r/revision/v9", &[]);
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.header("x-error-code"), Some("RevisionNotFound"));
}
