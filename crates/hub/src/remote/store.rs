//! Store clients: `object_store` clients configured from the environment, with the layer's timeouts and retries; and the crate's own runtime their futures run on.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, RetryConfig};

use super::error::{Redactor, RemoteError, RemoteErrorKind};
use super::url::StoreKind;
use super::watch::{Interrupt, Moved, Pace, watched};
use super::whole::KeepWhole;
use crate::cancel::Cancel;

/// The layer's timeouts, retries and first read, owned once.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tuning {
    /// One request, from sending it to its body's last byte.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Retries of one request after a 5xx, a reset, a short body or a timeout.
    pub max_retries: usize,
    /// No retry starts later than this after the first attempt.
    pub retry_timeout: Duration,
    /// The first backoff, doubled per retry up to `max_backoff`.
    pub init_backoff: Duration,
    pub max_backoff: Duration,
    /// The bytes the open's ranged GET reads and keeps: for most checkpoints, the header.
    pub open_prefix: u64,
    /// The pace every request must keep (`watch.rs`).
    pub pace: Pace,
}

impl Default for Tuning {
    /// NOTE: the defaults follow the stores' guidance, not a measurement here: their
    /// clients time out after tens of seconds and retry 3-10 times from ~100 ms; 60 s
    /// covers a 16 MiB ranged GET at ~280 KiB/s, and the pace catches a stalled server
    /// sooner.
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_retries: 5,
            retry_timeout: Duration::from_secs(30),
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            open_prefix: 64 * 1024,
            pace: Pace::default(),
        }
    }
}

impl Tuning {
    /// The defaults, the pace's window from `SAFELOAD_REMOTE_STALL_SECS`.
    pub(crate) fn from_env() -> Self {
        let var = std::env::var(super::watch::STALL_VAR).ok();
        Self {
            pace: Pace::from_var(var.as_deref()),
            ..Self::default()
        }
    }

    fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: self.init_backoff,
                max_backoff: self.max_backoff,
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }

    /// The client settings as `object_store`'s configuration values.
    fn client_config(&self) -> [(ClientConfigKey, String); 2] {
        [
            (
                ClientConfigKey::Timeout,
                format!("{}ms", self.request_timeout.as_millis()),
            ),
            (
                ClientConfigKey::ConnectTimeout,
                format!("{}ms", self.connect_timeout.as_millis()),
            ),
        ]
    }
}

/// Where a store's configuration comes from.
#[derive(Debug, Clone)]
pub(crate) enum StoreEnv {
    /// The process's environment, read by each builder's `from_env`.
    Process,
    /// These variables instead, read by the same names.
    #[cfg_attr(not(test), allow(dead_code))]
    Vars(Vec<(String, String)>),
}

impl StoreEnv {
    /// The variables starting with `prefix` (the process's too), each with its value.
    fn vars(&self, prefix: &str) -> Vec<(String, String)> {
        let all: Vec<(String, String)> = match self {
            StoreEnv::Process => std::env::vars().collect(),
            StoreEnv::Vars(vars) => vars.clone(),
        };
        all.into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect()
    }

    /// The secrets among the variables, to be scrubbed from errors.
    pub(crate) fn add_secrets(&self, redactor: &mut Redactor) {
        for prefix in ["AWS_", "GOOGLE_", "AZURE_"] {
            for (key, value) in self.vars(prefix) {
                let secret = ["SECRET", "TOKEN", "KEY", "PASSWORD", "SAS"]
                    .iter()
                    .any(|word| key.contains(word));
                // Key ids are not secrets, but are no business of an error either.
                if secret || key.ends_with("_ID") {
                    redactor.add(&value);
                }
            }
        }
    }
}

fn config_error(url: &str, redactor: &Redactor, e: &object_store::Error) -> RemoteError {
    RemoteError::new(RemoteErrorKind::Config, url, redactor.error_text(e))
}

/// A client of the bucket (or Azure container) `bucket` of a store.
pub(crate) fn bucket_store(
    kind: StoreKind,
    bucket: &str,
    env: &StoreEnv,
    tuning: &Tuning,
    redactor: &Redactor,
    shown: &str,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let fail = |e: object_store::Error| config_error(shown, redactor, &e);
    // Our timeouts first, so that the environment can override them by their names.
    let client = tuning.client_config();
    // The three builders share these methods, not a trait.
    macro_rules! build {
        ($builder:ident, $key:ident, $prefix:literal, $named:ident) => {{
            let mut b = match env {
                StoreEnv::Process => $builder::from_env(),
                StoreEnv::Vars(_) => $builder::new(),
            };
            for (key, value) in client {
                b = b.with_config($key::Client(key), value);
            }
            if let StoreEnv::Vars(_) = env {
                for (key, value) in env.vars($prefix) {
                    if let Ok(key) = key.to_ascii_lowercase().parse() {
                        b = b.with_config(key, value);
                    }
                }
            }
            let b = b.$named(bucket).with_retry(tuning.retry());
            Arc::new(b.with_http_connector(KeepWhole).build().map_err(fail)?)
        }};
    }
    let store: Arc<dyn ObjectStore> = match kind {
        StoreKind::S3 => build!(AmazonS3Builder, AmazonS3ConfigKey, "AWS_", with_bucket_name),
        StoreKind::Gcs => build!(
            GoogleCloudStorageBuilder,
            GoogleConfigKey,
            "GOOGLE_",
            with_bucket_name
        ),
        StoreKind::Azure => build!(
            MicrosoftAzureBuilder,
            AzureConfigKey,
            "AZURE_",
            with_container_name
        ),
    };
    Ok(store)
}

/// A client of the HTTP(S) base URL `base` (ending in `/`), sending `headers`.
pub(crate) fn http_store(
    base: &str,
    headers: object_store::HeaderMap,
    tuning: &Tuning,
    redactor: &Redactor,
    shown: &str,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let mut options = ClientOptions::new()
        .with_default_headers(headers)
        .with_allow_http(base.starts_with("http://"));
    for (key, value) in tuning.client_config() {
        options = options.with_config(key, value);
    }
    // A trailing `/` would make an empty segment (`base//key`).
    let store = HttpBuilder::new()
        .with_url(base.trim_end_matches('/'))
        .with_client_options(options)
        .with_retry(tuning.retry())
        .with_http_connector(KeepWhole)
        .build()
        .map_err(|e| config_error(shown, redactor, &e))?;
    Ok(Arc::new(store))
}

/// The crate's own tokio runtime for the stores' futures (two `safeload-remote` threads),
/// one per remote checkpoint, with the cancel flags of the load that resolved it.
#[derive(Debug)]
pub(crate) struct IoRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    cancel: Cancel,
}

impl IoRuntime {
    pub(crate) fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// A runtime whose requests stop once `cancel`'s flags are set.
    pub(crate) fn new(cancel: Cancel) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("safeload-remote")
            .enable_io()
            .enable_time()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
            cancel,
        })
    }

    /// Runs the request `make` gives, blocking the calling thread, watched (`watch.rs`):
    /// dropped once it moves less than `pace` asks or the cancel flags are set. `make` is
    /// handed the counter its body's bytes go to.
    pub(crate) fn request<F>(
        &self,
        pace: Pace,
        make: impl FnOnce(Moved) -> F,
    ) -> Result<F::Output, Interrupt>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let moved = Moved::default();
        let request = make(std::sync::Arc::clone(&moved));
        let cancel = &self.cancel;
        self.block_on(async move { watched(request, &moved, pace, cancel).await })
    }

    /// Runs `future` to completion here, blocking the calling thread (from inside another
    /// tokio runtime, on a scoped thread). Unwatched: requests go through
    /// [`request`](Self::request).
    pub(super) fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let Some(runtime) = &self.runtime else {
            unreachable!("the runtime is only taken in drop")
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return runtime.block_on(future);
        }
        std::thread::scope(|scope| {
            let worker = scope.spawn(|| runtime.block_on(future));
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                // Joining here would block a runtime's thread, which tokio forbids.
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_build_from_their_variables_without_a_request() {
        let env = StoreEnv::Vars(vec![
            ("AWS_ENDPOINT_URL".into(), "http://127.0.0.1:1".into()),
            ("AWS_ACCESS_KEY_ID".into(), "AKIDEXAMPLE".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "wJalrXUtnFEMI".into()),
            ("AWS_REGION".into(), "eu-west-1".into()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("AZURE_STORAGE_ACCOUNT_NAME".into(), "account".into()),
            ("AZURE_STORAGE_ACCOUNT_KEY".into(), "a2V5".into()),
            ("GOOGLE_SERVICE_ACCOUNT_KEY".into(), "{not json".into()),
        ]);
        let tuning = Tuning::default();
        let r = Redactor::default();
        let s3 = bucket_store(StoreKind::S3, "bucket", &env, &tuning, &r, "s3://bucket");
        assert!(s3.unwrap().to_string().contains("bucket"));
        let az = bucket_store(StoreKind::Azure, "c", &env, &tuning, &r, "az://c");
        assert!(az.is_ok());
        // A bad credential is a configuration error naming the address, not a panic.
        let mut redactor = Redactor::default();
        env.add_secrets(&mut redactor);
        let gs = bucket_store(StoreKind::Gcs, "b", &env, &tuning, &redactor, "gs://b");
        let err = gs.err().unwrap();
        assert_eq!(err.kind, RemoteErrorKind::Config);
        assert_eq!(err.url, "gs://b");
        assert!(!err.to_string().contains("{not json"), "{err}");
    }

    #[test]
    fn the_runtime_runs_futures_from_plain_threads_and_from_inside_another_runtime() {
        let rt = IoRuntime::new(crate::cancel::Cancel::NONE).unwrap();
        assert_eq!(rt.block_on(async { 40 + 2 }), 42);
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = outer.block_on(async { rt.block_on(async { 7 }) });
        assert_eq!(got, 7);
    }
}
