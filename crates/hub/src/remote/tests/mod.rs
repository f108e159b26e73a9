//! The remote layer against servers on this machine: the crate's own HTTP test server
//! (`http.rs`, and as the hub `hub.rs`) and an S3-compatible one, `moto_server` (`moto.rs`).

mod http;
mod hub;
mod moto;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::hub::HubConfig;
use super::location::{RemoteLocation, RemoteSettings};
use super::store::{IoRuntime, StoreEnv, Tuning};

/// Timeouts and backoffs short enough for tests, retries as in production.
fn quick_tuning() -> Tuning {
    Tuning {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
        init_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        open_prefix: 4096,
        pace: super::watch::Pace::default(),
    }
}

/// Settings reading nothing from the process: the hub at `endpoint`, stores from `vars`.
fn settings(endpoint: &str, vars: &[(&str, &str)], tuning: Tuning) -> RemoteSettings {
    RemoteSettings {
        env: StoreEnv::Vars(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        hub: HubConfig::from_vars(
            |name| match name {
                "HF_ENDPOINT" => Some(endpoint.to_owned()),
                _ => vars
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string()),
            },
            |_| None,
        ),
        tuning,
    }
}

fn location(url: &str, settings: RemoteSettings) -> RemoteLocation {
    let runtime = Arc::new(IoRuntime::new(crate::cancel::Cancel::NONE).unwrap());
    RemoteLocation::new(url, settings, runtime).unwrap()
}

/// `len` bytes that differ at every offset a test reads (not a short period).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A directory holding `files` (name, contents).
fn tree(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, contents) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

#[test]
fn settings_from_the_process_environment_configure_without_a_request() {
    let runtime = Arc::new(IoRuntime::new(crate::cancel::Cancel::NONE).unwrap());
    for url in [
        "s3://bucket/models/llama",
        "hf://org/repo@main",
        "http://127.0.0.1:9/x/",
    ] {
        let place = RemoteLocation::new(url, RemoteSettings::from_env(), Arc::clone(&runtime));
        assert!(place.is_ok(), "{url}: {:?}", place.err());
    }
    let bad = RemoteLocation::new("ftp://x/y", RemoteSettings::from_env(), runtime);
    assert!(bad.is_err());
}
