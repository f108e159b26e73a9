//! Remote objects read from `safeload-testhttp` as the hub serves them: the token, the
//! redirect's metadata, one commit for every file of a load, a hub that cannot be reached.

use std::time::Duration;

use safeload_testhttp::{DEFAULT_COMMIT, Options, hex_sha256};

use super::http::serve;
use super::{location, pattern, quick_tuning, settings};
use crate::remote::error::RemoteErrorKind;
use crate::remote::store::Tuning;
use crate::source::Source;

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
