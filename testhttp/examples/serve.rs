//! Serves a directory on loopback until killed, for trying a remote load by hand:
//! `cargo run --release -p safeload-testhttp --example serve -- DIR [LATENCY_MS] [LINK_MIB_S]`,
//! then `HF_ENDPOINT=<url> safeload load hf://org/repo` or `safeload load <url>/`.

use std::time::Duration;

use safeload_testhttp::{Options, Server};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("a directory to serve");
    let latency: u64 = args.next().map_or(0, |a| a.parse().expect("latency in ms"));
    let link: u64 = args.next().map_or(0, |a| a.parse().expect("link in MiB/s"));
    let server = Server::start(
        std::path::Path::new(&dir),
        Options {
            latency: (latency > 0).then(|| Duration::from_millis(latency)),
            bandwidth_bytes_per_sec: (link > 0).then_some(link << 20),
            ..Options::default()
        },
    )
    .expect("the server starts");
    println!("{}", server.url());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
