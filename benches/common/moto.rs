//! `moto_server` (the `moto[server]` Python package), an S3-compatible store on
//! `127.0.0.1`, started for a benchmark and filled with a checkpoint: as the crate's moto
//! tests start it (`src/remote/tests/moto.rs`), killed and reaped on drop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::http_client::Connection;

/// The canned ACL of every object put: readable without credentials.
const PUBLIC_READ: &str = "x-amz-acl: public-read\r\n";

pub struct Moto {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts `moto_server` (else `python3 -m moto.server`) on a free loopback port and
    /// waits, at most 30 s, until it listens.
    pub fn start() -> Result<Moto, String> {
        // A port the OS just handed out and took back: free unless another process races.
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
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
        let child = spawn("moto_server", &[])
            .or_else(|_| spawn("python3", &["-m", "moto.server"]))
            .map_err(|e| format!("starting moto_server ({e}); pip install 'moto[server]'"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut moto = Moto { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!("moto_server exited before listening: {status}"));
            }
            if Instant::now() > deadline {
                return Err("moto_server did not listen within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(moto)
    }

    /// Creates `bucket` and puts every file of `root` under `prefix/` (path-style, unsigned:
    /// moto checks no signature), each readable by anyone, so that the raw client's unsigned
    /// GETs are answered (moto refuses an unsigned GET of a private object: 403).
    pub fn upload(&self, bucket: &str, prefix: &str, root: &Path) -> Result<(), String> {
        let mut conn = Connection::new(&self.addr.to_string());
        let status = conn
            .put(&format!("/{bucket}"), "", &mut std::io::empty(), 0)
            .map_err(|e| format!("CreateBucket {bucket}: {e}"))?;
        if status != 200 {
            return Err(format!("CreateBucket {bucket}: status {status}"));
        }
        let mut files: Vec<_> = std::fs::read_dir(root)
            .map_err(|e| format!("{}: {e}", root.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for path in files {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let mut file =
                std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let len = file.metadata().map_err(|e| e.to_string())?.len();
            let target = format!("/{bucket}/{prefix}/{name}");
            let status = conn
                .put(&target, PUBLIC_READ, &mut file, len)
                .map_err(|e| format!("PUT {target}: {e}"))?;
            if status != 200 {
                return Err(format!("PUT {target}: status {status}"));
            }
        }
        Ok(())
    }
}
