//! The blocking entry points of a `Loader`: `load`, `open` and `warm`, each resolve -> open -> the rest (`execute/`, `checkpoint/`, the extras' warm-up), and the job's exchange joined where the environment asks.

use std::path::Path;
use std::time::Instant;

use super::Loader;
use crate::cancel;
use crate::checkpoint::{self, Checkpoint};
use crate::cluster::{Engine, Exchange};
use crate::error::{Error, Operation, Result};
use crate::execute::Run;
use crate::extras::{WarmFile, Warming};
use crate::file;
use crate::policy::Environment;
use crate::resolve::{self, Resolved, ShardFile};
use crate::state_dict::StateDict;

impl<X> Loader<X> {
    /// Loads the checkpoint at `path`: a `.safetensors` file, a
    /// `*.safetensors.index.json`, or a directory holding
    /// `model.safetensors`, `model.safetensors.index.json` or exactly one
    /// `*.safetensors` file.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<StateDict> {
        let path = path.as_ref();
        cancel::scope(&self.opts.cancel, path, || self.load_now(path))
    }

    /// [`load`](Self::load), in the scope of its cancel flags.
    fn load_now(&self, path: &Path) -> Result<StateDict> {
        let clock = Instant::now();
        let env = Environment::from_process();
        let resolved = resolve::resolve(path, self.opts.caching(), &*self.opts.extras)?;
        let shards = self.shards_to_open(&resolved);
        let (files, notes) = file::open_all(&self.opts, &resolved, &shards, &env, clock)?;
        // Cancelled while opening: stop before anything is read.
        if self.opts.cancel.is_set() {
            return Err(cancel::cancelled(path));
        }
        let files: Vec<_> = files.iter().map(|f| (f, f.opened_at())).collect();
        // The job's exchange: the engine's, else `SAFELOAD_EXCHANGE`'s.
        let engine = self.opts.exchange.clone().map(Engine);
        let joined = match engine {
            Some(_) => None,
            None => join_exchange(&*self.opts.extras, path)?,
        };
        let mut opts = std::borrow::Cow::Borrowed(&self.opts);
        if let Some(joined) = joined.as_ref().filter(|_| opts.local_rank.is_none()) {
            opts.to_mut().local_rank = Some(joined.local_rank);
        }
        // One participant per node (local rank 0); the node's other ranks
        // wait for its node copies.
        let engine_member = engine.as_ref().is_some_and(|e| {
            let rank = crate::extras::LocalRank::from_setting(opts.local_rank, &env);
            e.nodes() > 1 && rank.size > 1 && rank.rank > 0
        });
        let joined_member = joined
            .as_ref()
            .is_some_and(|j| j.exchange.is_none() && j.nodes > 1);
        Run {
            opts: &opts,
            resolved: &resolved,
            env: &env,
            keep: self
                .opts
                .filter
                .as_deref()
                .map(|f| f as &(dyn Fn(&str) -> bool + Sync)),
            clock,
            notes,
            path,
            exchange: match &engine {
                Some(_) if engine_member => None,
                Some(engine) => Some(engine as &dyn Exchange),
                None => joined.as_ref().and_then(|j| j.exchange.as_deref()),
            },
            member: engine_member || joined_member,
        }
        .finish(&files)
    }

    /// Opens the checkpoint at `path` from its headers alone, for reads of
    /// the tensors an engine wants ([`Checkpoint`]): resolved and checked as
    /// [`load`](Self::load) does, every file kept open, mapped files mapped.
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load) for resolving the files and reading headers.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Checkpoint<X>> {
        let path = path.as_ref();
        cancel::scope(&self.opts.cancel, path, || {
            checkpoint::open_with(self.opts.clone(), path)
        })
    }

    /// The shards a load opens: with a filter and an index, those holding a
    /// tensor the filter keeps; else all.
    fn shards_to_open<'a>(&self, resolved: &'a Resolved) -> Vec<&'a ShardFile> {
        match (&self.opts.filter, &resolved.index) {
            (Some(keep), Some(index)) => {
                let wanted: std::collections::HashSet<&str> = index
                    .weight_map
                    .iter()
                    .filter(|(tensor, _)| keep(tensor))
                    .map(|(_, shard)| shard.as_str())
                    .collect();
                resolved
                    .shards
                    .iter()
                    .filter(|s| wanted.contains(s.name.as_str()))
                    .collect()
            }
            _ => resolved.shards.iter().collect(),
        }
    }

    /// Warms the page cache with the checkpoint at `path` without loading
    /// it, with this loader's [`prefetch`](Self::prefetch) streams (4 when
    /// unset), local rank and memory settings. Run in every local rank, the
    /// ranks split the bytes through a shared queue; each returns once every
    /// chunk is warm or skipped.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data = vec![0u8; 1 << 20];
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 20], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let report = safeload::Loader::new().prefetch(2).warm(&path)?;
    /// assert_eq!(report.total_bytes, std::fs::metadata(&path)?.len());
    /// eprintln!("{report}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When the checkpoint cannot be resolved, a file cannot be opened, or a
    /// read fails (with the file and offset). Problems with the shared queue
    /// are not errors: the ranks then split the bytes statically.
    pub fn warm(&self, path: impl AsRef<Path>) -> Result<crate::report::PrefetchReport> {
        let env = Environment::from_process();
        let resolved = resolve::resolve(path.as_ref(), self.opts.caching(), &*self.opts.extras)?;
        if resolved.is_remote() {
            return Err(Error::remote_failed(
                Operation::Prefetch,
                path.as_ref(),
                None,
                crate::error::RemoteFailure::Unsupported,
                "a remote checkpoint has no page cache to warm; load it",
            ));
        }
        let shards: Vec<&ShardFile> = resolved.shards.iter().collect();
        let sources = file::open_sources(&self.opts, &resolved, &shards)?;
        let handed: Vec<WarmFile<'_>> = sources.iter().map(|s| WarmFile::of(s, true)).collect();
        let options = self.opts.prefetch.clone().unwrap_or_default();
        // Under `SAFELOAD_EXCHANGE`, the local ranks are the exchange's; each
        // node warms its own page cache.
        let joined = match &self.opts.exchange {
            Some(_) => None,
            None => join_exchange(&*self.opts.extras, path.as_ref())?,
        };
        // `warm` does not check the loader's flag (`Loader::cancel_on`).
        let exchange_rank = joined.as_ref().map(|j| j.local_rank);
        let job = self
            .opts
            .warm_job(&env, exchange_rank, &crate::cancel::Cancel::NONE);
        let reason = crate::report::PrefetchReason::Requested {
            streams: options.stream_count(),
        };
        let warmed = self
            .opts
            .extras
            .warm_up(&handed, Warming::Only(&options, &reason), &job)?;
        warmed.ok_or_else(|| {
            let why = std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "this build's extras have no page-cache warm-up",
            );
            Error::io(Operation::Prefetch, path.as_ref(), None, why)
        })
    }
}

/// The job's exchange `SAFELOAD_EXCHANGE` asks for (a collective), joined
/// through `extras`; a failure is an I/O error of
/// [`Operation::Exchange`](Operation::Exchange) on `path`.
fn join_exchange(
    extras: &dyn crate::extras::Extras,
    path: &Path,
) -> Result<Option<crate::cluster::Joined>> {
    crate::cluster::from_env(|name| extras.join_exchange(name))
        .map_err(|why| Error::io(Operation::Exchange, path, None, std::io::Error::other(why)))
}
