//! An S3-compatible store for tests and benchmarks: `moto_server` (the `moto[server]` Python
//! package) started on `127.0.0.1`, on a free port, and killed when dropped.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that makes a missing `moto_server` a failure rather than a skip (CI).
pub const REQUIRE_MOTO: &str = "SAFELOAD_REQUIRE_MOTO";

/// A `moto_server` of the caller's own; killed and reaped on drop.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts `moto_server` (or `python3 -m moto.server`) on a free loopback port and waits,
    /// at most 30 s, until it answers. `None`, after a `SKIPPED:` line on stderr, where it is
    /// not installed; under [`REQUIRE_MOTO`]`=1` that is a panic instead.
    pub fn start() -> Option<Moto> {
        let required = std::env::var_os(REQUIRE_MOTO).is_some_and(|v| v == "1");
        // A port the OS just handed out and took back: free unless another process races.
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let args = ["-H", "127.0.0.1", "-p", &port.to_string()].map(str::to_owned);
        let spawn = |program: &str, first: &[&str]| {
            Command::new(program)
                .args(first)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
        };
        let spawned = spawn("moto_server", &[]).or_else(|e| {
            let has_module = Command::new("python3")
                .args(["-c", "import moto.server"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if has_module {
                spawn("python3", &["-m", "moto.server"])
            } else {
                Err(e)
            }
        });
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let reason =
                    format!("moto_server cannot be started ({e}); pip install 'moto[server]'");
                assert!(!required, "{REQUIRE_MOTO}=1 but {reason}");
                eprintln!("SKIPPED: {reason}");
                return None;
            }
        };
        let mut moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto_server exited before listening: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(moto)
    }

    /// Its address, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The environment an S3 client reads to reach it (any key: moto checks no signature).
    pub fn s3_vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "moto-secret-key-123".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
    }

    /// Creates `bucket` (S3's `CreateBucket`, a bare `PUT /bucket`).
    pub fn create_bucket(&self, bucket: &str) -> io::Result<()> {
        self.put_raw(&format!("/{bucket}"), &[])
    }

    /// Stores `bytes` as `key` of `bucket` (S3's `PutObject`, one unsigned `PUT`), or
    /// replaces what is there: the object is made writable by anyone (`x-amz-acl:
    /// public-read-write`), since moto refuses an unsigned `PUT` over a private object.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> io::Result<()> {
        self.put_raw(&format!("/{bucket}/{key}"), bytes)
    }

    fn put_raw(&self, target: &str, body: &[u8]) -> io::Result<()> {
        let object = target.matches('/').count() > 1;
        let addr = self.endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let acl = if object {
            "x-amz-acl: public-read-write\r\n"
        } else {
            ""
        };
        let head = format!(
            "PUT {target} HTTP/1.1\r\nHost: {addr}\r\n{acl}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        if answer.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            let line = answer.lines().next().unwrap_or_default().to_owned();
            Err(io::Error::other(format!("PUT {target}: {line}")))
        }
    }
}
