//! Read once per cluster through the public trait (`safeload::cluster::Communicator`), as an
//! engine with a communicator of its own uses it: nodes are threads of this process, joined
//! by a communicator written here (a barrier with a deadline, and shared slots), each loading
//! with its own `Loader`. Under MPI the same is tested by the MPI crate's lib tests
//! (`crates/mpi/src/load_tests.rs`); here, what a build says of an exchange it does not have.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use safeload::cluster::Communicator;
use safeload::error::Operation;
use safeload::report::{LoadNote, NodeCopy};
use safeload::{ErrorKind, Loader};
use safetensors::Dtype;

use crate::common::child::{PATH, child_command, run_role};
use crate::common::*;

/// What the nodes of one job share: the slots of the current call and a barrier.
struct Job {
    nodes: usize,
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Mutex<(usize, u64)>,
    turn: Condvar,
    /// A node that flips a bit of every range it receives.
    corrupt: Option<usize>,
}

struct Node {
    job: Arc<Job>,
    me: usize,
}

impl Job {
    fn nodes(nodes: usize, corrupt: Option<usize>) -> Vec<Node> {
        let job = Arc::new(Job {
            nodes,
            slots: Mutex::new(vec![Vec::new(); nodes]),
            barrier: Mutex::new((0, 0)),
            turn: Condvar::new(),
            corrupt,
        });
        (0..nodes)
            .map(|me| Node {
                job: Arc::clone(&job),
                me,
            })
            .collect()
    }

    /// Waits until every node has arrived, for at most 10 s (a node gone is a timeout; the
    /// debug build hashes each range slowly on a busy machine).
    fn wait(&self) -> io::Result<()> {
        let mut state = self.barrier.lock().unwrap();
        let generation = state.1;
        state.0 += 1;
        if state.0 == self.nodes {
            *state = (0, generation + 1);
            self.turn.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while state.1 == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "a node did not come within 10 s",
                ));
            }
            state = self.turn.wait_timeout(state, left).unwrap().0;
        }
        Ok(())
    }
}

impl Communicator for Node {
    fn node(&self) -> usize {
        self.me
    }

    fn nodes(&self) -> usize {
        self.job.nodes
    }

    fn all_gather(&self, mine: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        self.job.slots.lock().unwrap()[self.me] = mine.to_vec();
        self.job.wait()?;
        let all = self.job.slots.lock().unwrap().clone();
        self.job.wait()?;
        Ok(all)
    }

    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> io::Result<()> {
        if self.me == owner {
            self.job.slots.lock().unwrap()[owner] = buf.to_vec();
        }
        self.job.wait()?;
        if self.me != owner {
            buf.copy_from_slice(&self.job.slots.lock().unwrap()[owner]);
            if self.job.corrupt == Some(self.me) && buf.len() > 32 {
                buf[0] ^= 1;
            }
        }
        self.job.wait()
    }
}

/// A checkpoint of 3 shards of about 4 MiB in `dir`; its naive load.
fn checkpoint(dir: &Path, seed: &str) -> Vec<Spec> {
    let specs: Vec<Spec> = (0..12)
        .map(|i| spec(&format!("{seed}.w{i:02}"), Dtype::F32, &[256, 1024]))
        .collect();
    write_sharded(dir, &specs, 3);
    naive_load(&shards_of(dir))
}

/// Each node loads its path with its communicator, on a thread of its own.
fn load_on_nodes(
    nodes: Vec<Node>,
    paths: &[PathBuf],
) -> Vec<safeload::Result<safeload::StateDict>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .into_iter()
            .zip(paths)
            .map(|(node, path)| {
                scope.spawn(move || Loader::new().disable_mmap(true).exchange(node).load(path))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn nodes_read_their_share_and_receive_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let expected = checkpoint(dir.path(), "m");
    let paths = vec![dir.path().to_path_buf(); 3];
    let results = load_on_nodes(Job::nodes(3, None), &paths);
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    for (node, result) in results.into_iter().enumerate() {
        let sd = result.unwrap();
        assert_eq!(loaded(&sd), expected, "node {node}");
        let note = sd
            .report()
            .notes
            .iter()
            .find(|n| matches!(n, LoadNote::ReadOncePerCluster { .. }))
            .unwrap_or_else(|| panic!("node {node}: {:?}", sd.report().notes));
        // Three files, one piece each, one per node: a third read here.
        let LoadNote::ReadOncePerCluster {
            node: this,
            nodes,
            read,
            total,
        } = note
        else {
            unreachable!()
        };
        assert_eq!((*this, *nodes), (node, 3), "{note}");
        assert_eq!(*read * 3, *total, "{note}");
        assert!(note.to_string().contains("read 4.00 MiB of 12.0"), "{note}");
    }
}

#[test]
fn a_corrupted_range_fails_the_node_that_received_it_and_the_others_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path(), "c");
    let paths = vec![dir.path().to_path_buf(); 3];
    let t0 = Instant::now();
    let results = load_on_nodes(Job::nodes(3, Some(1)), &paths);
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    let errors: Vec<safeload::Error> = results.into_iter().map(|r| r.unwrap_err()).collect();
    let corrupt = &errors[1];
    assert!(
        matches!(
            corrupt.kind(),
            ErrorKind::Io {
                operation: Operation::Exchange,
                ..
            }
        ),
        "{corrupt}"
    );
    assert_eq!(
        corrupt.io_error().map(io::Error::kind),
        Some(io::ErrorKind::InvalidData),
        "{corrupt}"
    );
    assert!(
        corrupt.to_string().contains("arrived corrupted on node 1"),
        "{corrupt}"
    );
    for e in [&errors[0], &errors[2]] {
        assert_eq!(
            e.io_error().map(io::Error::kind),
            Some(io::ErrorKind::TimedOut),
            "{e}"
        );
    }
}

#[test]
fn a_node_loading_other_files_makes_every_node_read_alone() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = checkpoint(a.path(), "a");
    let second = checkpoint(b.path(), "b");
    let paths = vec![
        a.path().to_path_buf(),
        a.path().to_path_buf(),
        b.path().to_path_buf(),
    ];
    let results = load_on_nodes(Job::nodes(3, None), &paths);
    for (node, result) in results.into_iter().enumerate() {
        let sd = result.unwrap();
        let want = if node == 2 { &second } else { &first };
        assert_eq!(&loaded(&sd), want, "node {node}");
        assert!(
            sd.report()
                .notes
                .iter()
                .any(|n| matches!(n, LoadNote::NodesReadAlone { why } if why.starts_with("node 2 sees another"))),
            "node {node}: {:?}",
            sd.report().notes
        );
    }
    // A converting load cannot take part: every node says so and reads alone.
    let nodes = Job::nodes(2, None);
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .into_iter()
            .map(|node| {
                let path = a.path();
                scope.spawn(move || {
                    Loader::new()
                        .disable_mmap(true)
                        .exchange(node)
                        .dtype(Dtype::F16)
                        .load(path)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for result in results {
        let sd = result.unwrap();
        assert!(
            sd.report()
                .notes
                .iter()
                .any(|n| n.to_string() == "each node read alone (node 0: the load converts dtypes)"),
            "{:?}",
            sd.report().notes
        );
    }
}

/// A job of two nodes whose collectives a node's other local rank never calls.
struct NeverCalled;

impl Communicator for NeverCalled {
    fn node(&self) -> usize {
        0
    }

    fn nodes(&self) -> usize {
        2
    }

    fn all_gather(&self, _mine: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        panic!("a node's other local rank called all_gather")
    }

    fn broadcast(&self, _owner: usize, _buf: &mut [u8]) -> io::Result<()> {
        panic!("a node's other local rank called broadcast")
    }
}

#[test]
fn child() {
    run_role(&[
        ("member-alone", member_alone),
        ("exchange-named", exchange_named),
    ]);
}

/// Set in a child: the words its load's error must hold.
const WORDS: &str = "SAFELOAD_TEST_EXCHANGE_WORDS";

/// A child: a load under the `SAFELOAD_EXCHANGE` its parent set, refused before a byte is
/// read, as an error of the exchange naming the checkpoint and saying [`WORDS`].
fn exchange_named() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let words = std::env::var(WORDS).unwrap();
    let err = Loader::new().disable_mmap(true).load(&path).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Io {
                operation: Operation::Exchange,
                ..
            }
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains(&words), "{text}");
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
}

/// Runs the `exchange-named` child under `SAFELOAD_EXCHANGE=<named>`.
fn refused_exchange(named: &str, words: &str) {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path(), "x");
    let out = child_command(module_path!(), "exchange-named", dir.path())
        .env("SAFELOAD_EXCHANGE", named)
        .env(WORDS, words)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE exchange-named\n"),
        "{named}: {}\n{stdout}",
        out.status
    );
}

#[test]
fn an_exchange_no_extra_knows_is_refused_naming_it() {
    refused_exchange(
        " carrier-pigeon ",
        "SAFELOAD_EXCHANGE=\"carrier-pigeon\" is not an exchange this build knows",
    );
}

/// Without the feature `mpi`, the facade still knows the name, and says what would take it.
#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_without_the_feature_is_refused_saying_which_feature_takes_it() {
    refused_exchange(
        "mpi",
        "SAFELOAD_EXCHANGE=mpi needs safeload built with the feature `mpi`",
    );
}

/// A child: local rank 1 of 2 of a two-node job, whose participant never comes. It waits
/// the exchange's timeout (1 s, set by the parent) for the node copy, then reads alone,
/// saying why, with the tensors of a plain read.
fn member_alone() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let start = Instant::now();
    let sd = Loader::new()
        .disable_mmap(true)
        .local_rank(1, 2)
        .exchange(NeverCalled)
        .load(&path)
        .unwrap();
    let waited = start.elapsed();
    assert!(
        (Duration::from_secs(1)..Duration::from_secs(20)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(loaded(&sd), naive_load(&shards_of(&path)));
    for file in &sd.report().files {
        let copy = file.node_copy.as_ref().unwrap();
        assert!(
            matches!(copy, NodeCopy::Failed { why } if why.starts_with("the node's participant offered no copy within 1s")),
            "{copy:?}"
        );
        assert!(
            copy.to_string().contains("each rank loads it alone"),
            "{copy}"
        );
    }
}

#[test]
fn a_nodes_other_rank_whose_participant_never_comes_reads_alone_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path(), "w");
    let out = child_command(module_path!(), "member-alone", dir.path())
        .env("SAFELOAD_EXCHANGE_TIMEOUT_SECS", "1")
        .env_remove("SAFELOAD_EXCHANGE")
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE member-alone\n"),
        "{}\n{stdout}",
        out.status
    );
}
