//! What a cold load asks of a server: each shard's bytes sent once (the open's first bytes
//! used, never fetched again), through the hub cache, without it, and from a plain HTTP
//! server.

use safeload_testhttp::{Options, Server};

use super::*;

/// Asserts that each of `shards` (served from `dir` by `server`) crossed the link no more
/// than once.
fn assert_sent_once(server: &Server, dir: &Path, shards: &[String], what: &str) {
    for name in shards {
        let sent = server.path_stats(name).bytes_sent;
        let len = std::fs::metadata(dir.join(name)).unwrap().len();
        assert!(sent > 0, "{what}: {name} was not fetched");
        assert!(sent <= len, "{what}: {name}: {sent} bytes sent for {len}");
    }
}

#[test]
fn a_cold_hub_load_sends_each_shards_bytes_once() {
    let shards: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
    // Tensors read in parts (every dtype), and files read whole into the file being
    // written (aligned): through the hub cache, and with it off.
    for (what, hub) in [
        ("every dtype", Hub::new(Options::default())),
        ("aligned", Hub::aligned(Options::default())),
    ] {
        let cold = hub.load("hf://org/model", &[]);
        assert_eq!(cold.digest, hub.digest(), "{what}");
        assert!(cold.every("written"), "{what}: {cold:#?}");
        assert_sent_once(&hub.server, hub.files.path(), &shards, what);
        hub.server.reset_stats();
        let off = [("SAFELOAD_HUB_CACHE", "0".to_owned())];
        let uncached = hub.load("hf://org/model", &off);
        assert_eq!(uncached.digest, hub.digest(), "{what}");
        assert_sent_once(&hub.server, hub.files.path(), &shards, what);
    }
}

#[test]
fn a_plain_http_load_sends_each_shards_bytes_once() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..6)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[256, 1024 + i]))
        .chain(every_dtype())
        .collect();
    write_sharded(dir.path(), &specs, 3);
    let server = Server::start(dir.path(), Options::default()).unwrap();
    let sd = Loader::new().load(format!("{}/", server.url())).unwrap();
    assert_eq!(loaded(&sd), naive_load(&shards_of(dir.path())));
    let shards: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
    assert_sent_once(&server, dir.path(), &shards, "http");
}
