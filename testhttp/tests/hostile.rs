//! The hostile server's knobs as a client sees them, through a plain `TcpStream`: a body
//! dripped a byte at a time, requests never answered, a claimed length met with filler (for
//! every path, or chosen ones, the hub's listing lying with it or not), a foreign commit
//! answered with the server's own, a 404 without its commit.

mod common;
use common::{Head, read_head, start, tree, write_request};

use std::io::{self, Read};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use safeload_testhttp::{DEFAULT_COMMIT, Options, Server, Stats};

/// A commit the server does not have.
const FOREIGN: &str = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";

/// Connects and sends one request (no body).
fn send(server: &Server, method: &str, target: &str, headers: &[&str]) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    write_request(&mut stream, method, target, headers);
    stream
}

/// One request on its own connection: its head and its whole body.
fn fetch(server: &Server, method: &str, target: &str) -> (Head, Vec<u8>) {
    let mut stream = send(server, method, target, &[]);
    let head = read_head(&mut stream);
    let mut body = vec![
        0;
        if method == "HEAD" {
            0
        } else {
            head.content_length() as usize
        }
    ];
    stream.read_exact(&mut body).unwrap();
    (head, body)
}

/// Whether nothing at all arrives on `stream` for `wait`.
fn silent_for(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0; 1];
    let silent = matches!(
        stream.read(&mut byte),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
    );
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    silent
}

/// Polls the server's counters until `done` holds of them (at most 10 s).
fn wait_for(server: &Server, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = server.stats();
        if done(&stats) || Instant::now() > deadline {
            return stats;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Drops `server` and returns how long that took (the bound leaves room for a loaded CI
/// machine; the server's own promise is 50 ms a thread).
fn time_drop(server: Server) -> Duration {
    let t0 = Instant::now();
    drop(server);
    t0.elapsed()
}

#[test]
fn drip_sends_one_byte_per_pause_on_both_routes() {
    let (dir, _) = tree(10);
    let pause = Duration::from_millis(40);
    let server = start(
        dir.path(),
        Options {
            drip: Some(pause),
            ..Options::default()
        },
    );
    for target in ["/sub/small.bin", "/o/r/resolve/main/sub/small.bin"] {
        let mut stream = send(&server, "GET", target, &[]);
        let head = read_head(&mut stream);
        assert_eq!((head.status, head.content_length()), (200, 5), "{target}");
        let t0 = Instant::now();
        let mut body = [0; 5];
        stream.read_exact(&mut body).unwrap();
        // Five bytes, a pause between each two: four pauses at least.
        let took = t0.elapsed();
        assert!(took >= pause * 4, "{target}: {took:?}");
        assert_eq!(&body, b"hello");
    }
    assert_eq!(server.stats().bytes_sent, 10);
    assert_eq!(server.path_stats("sub/small.bin").bytes_sent, 10);
    // A HEAD has no body to drip: answered at once.
    let (head, _) = fetch(&server, "HEAD", "/sub/small.bin");
    assert_eq!(head.content_length(), 5);
}

#[test]
fn a_long_drip_ends_at_the_hang_up_and_at_the_stop() {
    let (dir, data) = tree(1000);
    let server = start(
        dir.path(),
        Options {
            drip: Some(Duration::from_millis(20)),
            max_connections: 1,
            ..Options::default()
        },
    );
    let mut stream = send(&server, "GET", "/model.safetensors", &[]);
    read_head(&mut stream);
    let mut some = [0; 3];
    stream.read_exact(&mut some).unwrap();
    assert_eq!(some, data[..3]);
    drop(stream);
    // The one thread is free again once a write found the client gone.
    let (head, body) = {
        let mut stream = send(&server, "GET", "/sub/small.bin", &[]);
        let head = read_head(&mut stream);
        let mut body = [0; 5];
        stream.read_exact(&mut body).unwrap();
        (head, body)
    };
    assert_eq!((head.status, &body), (200, b"hello"));
    assert!(server.stats().bytes_sent < 1000, "{:?}", server.stats());

    // A pause far longer than the test: the stop cuts it short.
    let server = start(
        dir.path(),
        Options {
            drip: Some(Duration::from_secs(30)),
            ..Options::default()
        },
    );
    let mut stream = send(&server, "GET", "/model.safetensors", &[]);
    read_head(&mut stream);
    stream.read_exact(&mut some[..1]).unwrap();
    let took = time_drop(server);
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_silent_head_is_held_until_the_client_hangs_up_or_the_server_stops() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            silent_heads: true,
            // One thread: the next connection is served only once the held one ended.
            max_connections: 1,
            ..Options::default()
        },
    );
    let mut held = send(&server, "HEAD", "/sub/small.bin", &[]);
    assert!(silent_for(&mut held, Duration::from_millis(300)));
    let stats = server.stats();
    assert_eq!((stats.head_requests, stats.unanswered), (1, 1), "{stats:?}");
    drop(held);
    let (head, body) = fetch(&server, "GET", "/sub/small.bin");
    assert_eq!((head.status, &body[..]), (200, &b"hello"[..]));

    // Held again; then the server stops under it and closes it.
    let mut held = send(&server, "HEAD", "/o/r/resolve/main/sub/small.bin", &[]);
    let stats = wait_for(&server, |s| s.unanswered == 2);
    assert_eq!(stats.unanswered, 2, "{stats:?}");
    let took = time_drop(server);
    assert!(took < Duration::from_secs(1), "{took:?}");
    held.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut byte = [0; 1];
    assert!(matches!(held.read(&mut byte), Ok(0) | Err(_)));
}

#[test]
fn silent_gets_hold_objects_but_the_hub_api_answers() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            silent_gets: true,
            ..Options::default()
        },
    );
    let mut static_get = send(&server, "GET", "/sub/small.bin", &[]);
    let mut hub_get = send(&server, "GET", "/o/r/resolve/main/sub/small.bin", &[]);
    assert!(silent_for(&mut static_get, Duration::from_millis(300)));
    assert!(silent_for(&mut hub_get, Duration::from_millis(50)));
    let (api, body) = fetch(&server, "GET", "/api/models/o/r/revision/main");
    assert_eq!(api.status, 200);
    assert!(!body.is_empty());
    // HEADs are not held unless `silent_heads` says so.
    let (head, _) = fetch(&server, "HEAD", "/sub/small.bin");
    assert_eq!(head.status, 200);
    let stats = server.stats();
    assert_eq!(stats.unanswered, 2, "{stats:?}");
    drop((static_get, hub_get));
    let took = time_drop(server);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[test]
fn a_claimed_length_is_met_with_filler_until_the_client_hangs_up() {
    let (dir, data) = tree(1000);
    let claim: u64 = 1 << 40;
    let server = start(
        dir.path(),
        Options {
            ignore_range: true,
            claimed_len: Some(claim),
            ..Options::default()
        },
    );
    let (head, _) = fetch(&server, "HEAD", "/o/r/resolve/main/model.safetensors");
    assert_eq!((head.status, head.content_length()), (200, claim));
    // Only the length lies: the hub's metadata names the real object.
    assert_eq!(head.header("x-linked-size"), Some("1000"));

    let mut stream = send(&server, "GET", "/model.safetensors", &["Range: bytes=0-9"]);
    let head = read_head(&mut stream);
    assert_eq!((head.status, head.content_length()), (200, claim));
    assert_eq!(head.header("content-range"), None);
    let mut object = vec![0; 1000];
    stream.read_exact(&mut object).unwrap();
    assert_eq!(object, data);
    // Well past the object (several chunks): zeros.
    let mut filler = vec![1; 300_000];
    stream.read_exact(&mut filler).unwrap();
    assert!(filler.iter().all(|&b| b == 0));
    drop(stream);

    // The server gives up at a write to the closed connection, and serves on.
    let mut last = u64::MAX;
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().bytes_sent != last && Instant::now() < deadline {
        last = server.stats().bytes_sent;
        thread::sleep(Duration::from_millis(200));
    }
    let stats = server.stats();
    assert!(stats.bytes_sent >= 301_000, "{stats:?}");
    assert!(stats.bytes_sent < 1 << 30, "{stats:?}");
    let mut stream = send(&server, "GET", "/sub/small.bin", &[]);
    assert_eq!(read_head(&mut stream).content_length(), claim);
    let mut small = [0; 8];
    stream.read_exact(&mut small).unwrap();
    assert_eq!(&small, b"hello\0\0\0");
    // The server is dropped with that body still going and its client not reading: the
    // write the client does not take is cut short too.
    let took = time_drop(server);
    assert!(took < Duration::from_secs(2), "{took:?}");

    // A claim shorter than the object: its first bytes only.
    let server = start(
        dir.path(),
        Options {
            ignore_range: true,
            claimed_len: Some(10),
            ..Options::default()
        },
    );
    let (head, body) = fetch(&server, "GET", "/model.safetensors");
    assert_eq!((head.content_length(), &body[..]), (10, &data[..10]));
    // Without `ignore_range`, no claim.
    let server = start(
        dir.path(),
        Options {
            claimed_len: Some(claim),
            ..Options::default()
        },
    );
    let (head, body) = fetch(&server, "GET", "/model.safetensors");
    assert_eq!((head.content_length(), body), (1000, data));
}

#[test]
fn whole_paths_ignore_range_for_those_paths_only_and_a_linked_size_may_lie_too() {
    let (dir, data) = tree(1000);
    let claim: u64 = 1 << 30;
    let server = start(
        dir.path(),
        Options {
            whole_paths: vec!["model.safetensors".to_owned()],
            claimed_len: Some(claim),
            ..Options::default()
        },
    );
    // The path named: a range answered whole, with the claim, on both routes.
    for target in ["/model.safetensors", "/o/r/resolve/main/model.safetensors"] {
        let mut stream = send(&server, "GET", target, &["Range: bytes=0-9"]);
        let head = read_head(&mut stream);
        assert_eq!(
            (head.status, head.content_length()),
            (200, claim),
            "{target}"
        );
        let mut object = vec![0; 1000];
        stream.read_exact(&mut object).unwrap();
        assert_eq!(object, data);
    }
    let (head, _) = fetch(&server, "HEAD", "/o/r/resolve/main/model.safetensors");
    assert_eq!(head.content_length(), claim);
    assert_eq!(
        head.header("x-linked-size"),
        Some("1000"),
        "the listing is true"
    );
    // Another path: its range, and no claim.
    let mut stream = send(&server, "GET", "/sub/small.bin", &["Range: bytes=1-2"]);
    let head = read_head(&mut stream);
    assert_eq!((head.status, head.content_length()), (206, 2));
    drop(stream);
    drop(server);

    // The listing lies with the body.
    let server = start(
        dir.path(),
        Options {
            whole_paths: vec!["model.safetensors".to_owned()],
            claimed_len: Some(claim),
            claim_linked_size: true,
            ..Options::default()
        },
    );
    let (head, _) = fetch(&server, "HEAD", "/o/r/resolve/main/model.safetensors");
    assert_eq!(head.content_length(), claim);
    assert_eq!(
        head.header("x-linked-size"),
        Some(claim.to_string().as_str())
    );
    // Where no claim applies, the listing says the object's length.
    let server = start(
        dir.path(),
        Options {
            claimed_len: Some(claim),
            claim_linked_size: true,
            ..Options::default()
        },
    );
    let (head, _) = fetch(&server, "HEAD", "/o/r/resolve/main/model.safetensors");
    assert_eq!(head.header("x-linked-size"), Some("1000"));
}

#[test]
fn a_foreign_commit_is_answered_with_the_servers_own() {
    let (dir, data) = tree(1000);
    let server = start(
        dir.path(),
        Options {
            foreign_commit: Some(FOREIGN.to_owned()),
            ..Options::default()
        },
    );
    let target = format!("/o/r/resolve/{FOREIGN}/model.safetensors");
    let (head, body) = fetch(&server, "GET", &target);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("x-repo-commit"), Some(DEFAULT_COMMIT));
    assert_eq!(body, data);
    assert_eq!(server.revision_requests(FOREIGN), 1);
    // Another unknown commit is still unknown.
    let other = "0123456789012345678901234567890123456789";
    let (head, _) = fetch(
        &server,
        "GET",
        &format!("/o/r/resolve/{other}/model.safetensors"),
    );
    assert_eq!(head.status, 404);
    assert_eq!(head.header("x-error-code"), Some("RevisionNotFound"));
}

#[test]
fn no_commit_on_404_leaves_entry_not_found_without_its_commit() {
    let (dir, _) = tree(10);
    let server = start(
        dir.path(),
        Options {
            no_commit_on_404: true,
            ..Options::default()
        },
    );
    let (head, _) = fetch(&server, "GET", "/o/r/resolve/main/nothing.bin");
    assert_eq!(head.status, 404);
    assert_eq!(head.header("x-error-code"), Some("EntryNotFound"));
    assert_eq!(head.header("x-repo-commit"), None);
    // A file found still names its commit.
    let (found, _) = fetch(&server, "HEAD", "/o/r/resolve/main/sub/small.bin");
    assert_eq!(found.header("x-repo-commit"), Some(DEFAULT_COMMIT));
}
